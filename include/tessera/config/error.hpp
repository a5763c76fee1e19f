#pragma once
/// \file config/error.hpp
/// tessera's exceptions. Every run-time check throws one of these with a message that names the
/// operation, the operands, their shapes and the rule that was broken.

#include <stdexcept>
#include <string>

namespace tessera {

/// Base of everything tessera throws on bad input.
class error : public std::invalid_argument {
public:
  using std::invalid_argument::invalid_argument;
};

/// A shape rule was broken (mismatched extents, wrong rank at run time, out-of-range slice).
class shape_error : public error {
public:
  using error::error;
};

/// An argument value outside its domain (a non-positive stride, a bad file, an unknown flag).
class value_error : public error {
public:
  using error::error;
};

} // namespace tessera
