// Fuzz target: the flag parser of examples/train_fashion_mnist.cpp
// (examples/train_fashion_mnist_options.hpp). The input, split at every '\0', is the argument
// list after the program name (at most 64 arguments). parse_options must return options or
// throw fashion::usage_error; any other exception escapes to std::terminate, i.e. a crash.
#include "fuzz_support.hpp"

#include "train_fashion_mnist_options.hpp"

#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args{"train_fashion_mnist"};
  std::string cur;
  for (std::size_t i = 0; i < size && args.size() <= 64; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (!cur.empty() && args.size() <= 64) args.push_back(cur);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr); // argv[argc] is a null pointer, as main's is
  try {
    const fashion::options o = fashion::parse_options(static_cast<int>(args.size()), argv.data());
    (void)o;
  } catch (const fashion::usage_error&) {
    // The documented refusal.
  }
  return 0;
}
