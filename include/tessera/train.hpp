#pragma once
/// \file train.hpp
/// Entry header of train/: mixed-precision training machinery — optimizers with fp32 state
/// (sgd, adamw), loss scaling (static_scaler, dynamic_scaler<Policy>), the scaled step
/// (train::step), fp8 scaling recipes (fp8_meta<current_scaling | delayed_scaling>, hybrid),
/// checkpoints (save_checkpoint / load_checkpoint), the team governor (team_governor: steps on
/// the whole thread team or a smaller one, whichever measures faster).

#include <tessera/train/adamw.hpp>
#include <tessera/train/checkpoint.hpp>
#include <tessera/train/fp8_recipe.hpp>
#include <tessera/train/grad_accumulation.hpp>
#include <tessera/train/grad_clip.hpp>
#include <tessera/train/loss_scaler.hpp>
#include <tessera/train/lr_schedule.hpp>
#include <tessera/train/sgd.hpp>
#include <tessera/train/step.hpp>
#include <tessera/train/team.hpp>
