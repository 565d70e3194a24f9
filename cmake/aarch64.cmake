# Cross-compiling for 64-bit ARM Linux with Debian's cross compiler (gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross); programs run on this machine through qemu-user. tests/arm/run.sh uses
# it for tests/arm/CMakeLists.txt:
#   cmake -S tests/arm -B build/arm -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
# Headers and libraries of the target only: the cross sysroot, and Debian's multiarch directory
# for arm64 packages (libcmocka-dev:arm64).
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
