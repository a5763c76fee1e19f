// Builds the precompiled header of the test programs (tests/CMakeLists.txt).
