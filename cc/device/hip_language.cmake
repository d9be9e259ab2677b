# Enables CMake's HIP language for the rocm flavour.
#
# A regular ROCm install (/opt/rocm) needs nothing here. Debian's packages
# (hipcc, libamdhip64-dev, rocm-device-libs; ROCm 5.2) put the device
# libraries and CMake configs where neither clang nor CMake look, and their
# `hipcc` picks the NVIDIA platform when nvcc is installed; we point CMake's
# HIP support at Debian's clang directly instead.
set(CMAKE_HIP_PLATFORM amd)
set(_debian_bitcode /usr/lib/x86_64-linux-gnu/amdgcn/bitcode)
if(NOT CMAKE_HIP_COMPILER AND NOT DEFINED ENV{HIPCXX}
   AND NOT EXISTS /opt/rocm AND EXISTS ${_debian_bitcode})
  file(GLOB _debian_clangs /usr/lib/llvm-*/bin/clang++)
  list(SORT _debian_clangs COMPARE NATURAL)
  list(GET _debian_clangs -1 CMAKE_HIP_COMPILER)
  string(APPEND CMAKE_HIP_FLAGS
    " --rocm-path=/usr --rocm-device-lib-path=${_debian_bitcode}")
  # hip-lang's config finds amd_comgr here; the compiler check runs in a
  # try_compile, which must see the same path.
  list(APPEND CMAKE_PREFIX_PATH /usr/lib/x86_64-linux-gnu/cmake)
  list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES CMAKE_PREFIX_PATH)
  # Debian's LLVM 15 knows gfx940 but not gfx942 (MI300X/MI325X); build for
  # those with a ROCm 6 toolchain.
  set(_default_archs gfx90a gfx940)
else()
  set(_default_archs gfx90a gfx942)
endif()
if(NOT DEFINED CMAKE_HIP_ARCHITECTURES)
  set(CMAKE_HIP_ARCHITECTURES ${_default_archs})
endif()
enable_language(HIP)
