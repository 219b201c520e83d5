# The optimizer library `dion` and everything built on LibTorch: tests, benchmarks, examples.
if(DION_DATA_ONLY)
  message(STATUS "dion: DION_DATA_ONLY=ON, skipping the LibTorch targets")
  return()
endif()

# Name the CUDA architectures up front (H100/H200 = 9.0): otherwise torch's CMake config tries
# to detect the installed GPUs by compiling and running a CUDA program, which fails here.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures for CUDA sources")
endif()
set(CMAKE_CUDA_STANDARD 17)
include(${CMAKE_CURRENT_LIST_DIR}/DionFindTorch.cmake)  # find_package(Torch), asking python3 if needed
message(STATUS "dion: LibTorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX})")

# CUDA sources are compiled whenever torch has CUDA and nvcc is found (compile + link only on a
# machine without a GPU); otherwise they are skipped with a message.
set(DION_HAVE_CUDA OFF)
if(TARGET torch_cuda OR TARGET c10_cuda)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(DION_HAVE_CUDA ON)
  else()
    message(STATUS "dion: torch has CUDA but nvcc was not found: CUDA sources skipped")
  endif()
else()
  message(STATUS "dion: torch built without CUDA: CUDA sources skipped")
endif()

# Torch's headers are third-party: include them as SYSTEM so -Werror applies to our code only.
get_target_property(_torch_inc torch INTERFACE_INCLUDE_DIRECTORIES)

# The communication library dion_comm: process groups over c10d (Gloo, NCCL), device meshes,
# async collectives (Work), one-thread cooperative tasks. Knows nothing of the optimizer.
# Gloo's headers come from Debian's libgloo-dev (the torch wheel ships the library, not them).
find_path(GLOO_INCLUDE_DIR gloo/context.h)
if(NOT GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "dion: <gloo/context.h> not found: install libgloo-dev (scripts/setup.sh does)")
endif()
add_library(dion_comm
  src/comm/group.cpp
  src/comm/mesh.cpp
  src/comm/work.cpp
  src/comm/tasks.cpp)
target_include_directories(dion_comm PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_link_libraries(dion_comm PUBLIC ${TORCH_LIBRARIES} PRIVATE dion_warnings)
target_include_directories(dion_comm SYSTEM PUBLIC ${_torch_inc})
target_include_directories(dion_comm SYSTEM PRIVATE ${GLOO_INCLUDE_DIR})
set_target_properties(dion_comm PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_precompile_headers(dion_comm PRIVATE <ATen/ATen.h>)
if(DION_HAVE_CUDA)
  target_compile_definitions(dion_comm PUBLIC DION_HAVE_CUDA)
endif()

add_library(dion
  src/math/ortho.cpp
  src/math/ortho_fast.cpp
  src/math/symmetric.cpp
  src/math/lr.cpp
  src/math/muon.cpp
  src/math/normuon.cpp
  src/math/dion2.cpp
  src/math/nordion2.cpp
  src/math/dion.cpp
  src/math/scalar.cpp
  src/optim/options.cpp
  src/optim/optimizer.cpp
  src/optim/agreement.cpp
  src/optim/state_layout.cpp
  src/optim/checkpoint.cpp
  src/cuda/fused.cpp)
target_include_directories(dion PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
# Position-independent: the Python module links this library into a shared object.
set_target_properties(dion PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(dion PUBLIC dion_comm ${TORCH_LIBRARIES} PRIVATE dion_warnings)
target_include_directories(dion SYSTEM PUBLIC ${_torch_inc})
target_precompile_headers(dion PRIVATE <ATen/ATen.h>)
if(DION_HAVE_CUDA)
  enable_language(CUDA)
  set(CMAKE_CUDA_ARCHITECTURES 90)  # H100 / H200
  target_sources(dion PRIVATE src/cuda/fused_kernels.cu)
  set_source_files_properties(src/cuda/fused_kernels.cu PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  target_compile_definitions(dion PUBLIC DION_HAVE_CUDA)
  message(STATUS "dion: CUDA kernels enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, sm_90)")
endif()

# The optimizer's Distribution over dion_comm: DDP / FSDP / FSDP x TP / HSDP layouts.
add_library(dion_dist src/dist/distributed.cpp)
target_link_libraries(dion_dist PUBLIC dion PRIVATE dion_warnings)
set_target_properties(dion_dist PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_precompile_headers(dion_dist PRIVATE <ATen/ATen.h>)

# A shared precompiled header for executables (tests, benchmarks, examples).
add_library(dion_pch STATIC ${CMAKE_CURRENT_SOURCE_DIR}/cmake/pch_dummy.cpp)
target_link_libraries(dion_pch PUBLIC dion PRIVATE dion_warnings)
target_precompile_headers(dion_pch PUBLIC <ATen/ATen.h> <torch/serialize.h> <torch/optim.h>)

function(dion_executable name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE dion dion_warnings)
  target_precompile_headers(${name} REUSE_FROM dion_pch)
endfunction()

# The Python module dion_cpp (pybind11 from the torch wheel).
include(${CMAKE_CURRENT_LIST_DIR}/DionPython.cmake OPTIONAL)
# The trainer's output formats: TensorBoard events, safetensors (dion_tb, dion_safetensors).
include(${CMAKE_CURRENT_LIST_DIR}/DionTrainIO.cmake)

add_subdirectory(examples)
# The GPT training program dion-train (tools/dion-train, docs/train.md).
include(${CMAKE_CURRENT_LIST_DIR}/DionTrain.cmake)
# The benchmark program dion-bench (tools/dion-bench, docs/benchmarks.md).
include(${CMAKE_CURRENT_LIST_DIR}/DionBench.cmake)
if(DION_BUILD_TESTS)
  add_subdirectory(tests)
endif()
if(DION_BUILD_BENCH)
  find_package(benchmark QUIET)
  if(benchmark_FOUND)
    add_subdirectory(bench)
  else()
    message(STATUS "dion: Google Benchmark not found: benchmarks skipped")
  endif()
endif()
