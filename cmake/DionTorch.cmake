# The optimizer library `dion` and everything built on LibTorch: tests, benchmarks, examples.
if(DION_DATA_ONLY)
  message(STATUS "dion: DION_DATA_ONLY=ON, skipping the LibTorch targets")
  return()
endif()

# CUDA architectures of our kernels: torch's own list (the wheel's torch._C._cuda_getArchFlags(),
# e.g. sm_75 ... sm_120) plus sm_90 (H100/H200), as real code, and PTX of the newest for GPUs
# after it. DION_CUDA_ARCHITECTURES overrides (CMake's CUDA_ARCHITECTURES syntax, e.g. "90-real").
# They are set on the target (CUDA_ARCHITECTURES below): torch's CMake ignores
# CMAKE_CUDA_ARCHITECTURES and puts -gencode flags for TORCH_CUDA_ARCH_LIST into CMAKE_CUDA_FLAGS
# instead, which are removed there so that the target property is the one list. TORCH_CUDA_ARCH_LIST
# is still named up front: otherwise torch's CMake config tries to detect the installed GPUs by
# compiling and running a CUDA program, which fails on a machine without one.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures torch's CMake is told (see DION_CUDA_ARCHITECTURES)")
endif()
set(DION_CUDA_ARCHITECTURES "" CACHE STRING
    "CUDA_ARCHITECTURES of the dion kernels (empty: torch's architectures plus 90)")
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
# async collectives (Work), one-thread cooperative tasks, FSDP2 chunks and their gathers and
# reduce-scatters. Knows nothing of the optimizer.
# Gloo's headers come from Debian's libgloo-dev (the torch wheel ships the library, not them).
find_path(GLOO_INCLUDE_DIR gloo/context.h)
if(NOT GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "dion: <gloo/context.h> not found: install libgloo-dev (scripts/setup.sh does)")
endif()
add_library(dion_comm
  src/comm/group.cpp
  src/comm/mesh.cpp
  src/comm/work.cpp
  src/comm/tasks.cpp
  src/comm/chunks.cpp)
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
  src/math/cpu_dtype.cpp
  src/math/symmetric.cpp
  src/math/qk_clip.cpp
  src/math/lr.cpp
  src/math/rates.cpp
  src/math/muon.cpp
  src/math/normuon.cpp
  src/math/dion2.cpp
  src/math/dion.cpp
  src/math/scalar.cpp
  src/math/elementwise.cpp
  src/math/elementwise_state.cpp
  src/math/elementwise_update.cpp
  src/math/bf16_matmul_cpu.cpp
  src/math/own_kernels.cpp
  src/optim/options.cpp
  src/optim/optimizer.cpp
  src/optim/plan.cpp
  src/optim/qk_clip.cpp
  src/optim/distribution.cpp
  src/optim/distributed.cpp
  src/optim/assembly.cpp
  src/optim/collectives.cpp
  src/optim/registry.cpp
  src/optim/drivers/operands.cpp
  src/optim/drivers/muon.cpp
  src/optim/drivers/dion2.cpp
  src/optim/drivers/dion.cpp
  src/optim/drivers/scalar.cpp
  src/optim/drivers/builtin.cpp
  src/optim/agreement.cpp
  src/optim/state_layout.cpp
  src/optim/checkpoint.cpp
  src/optim/cuda_graph.cpp
  src/cuda/fused.cpp
  src/cuda/symmetric.cpp)
target_include_directories(dion PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
# Position-independent: the Python module links this library into a shared object.
set_target_properties(dion PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(dion PUBLIC dion_comm ${TORCH_LIBRARIES} PRIVATE dion_warnings)
target_include_directories(dion SYSTEM PUBLIC ${_torch_inc})
target_precompile_headers(dion PRIVATE <ATen/ATen.h>)
if(DION_HAVE_CUDA)
  enable_language(CUDA)
  set(_dion_archs "${DION_CUDA_ARCHITECTURES}")
  if(NOT _dion_archs)
    set(_dion_sm "")
    if(Python3_EXECUTABLE)  # the wheel's list; a LibTorch without Python: 75 80 86 90 100 120
      execute_process(COMMAND "${Python3_EXECUTABLE}" -c "import torch; print(torch._C._cuda_getArchFlags())"
                      RESULT_VARIABLE _rc OUTPUT_VARIABLE _dion_sm ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(NOT _rc EQUAL 0)
        set(_dion_sm "")
      endif()
    endif()
    if(NOT _dion_sm)
      set(_dion_sm "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120")
    endif()
    string(REGEX MATCHALL "sm_[0-9]+" _dion_sm "${_dion_sm}")
    string(REPLACE "sm_" "" _dion_sm "${_dion_sm}")
    list(APPEND _dion_sm 90)
    list(REMOVE_DUPLICATES _dion_sm)
    list(SORT _dion_sm COMPARE NATURAL)
    list(GET _dion_sm -1 _dion_newest)
    list(TRANSFORM _dion_sm APPEND "-real" OUTPUT_VARIABLE _dion_archs)
    list(APPEND _dion_archs "${_dion_newest}-virtual")
  endif()
  # torch's -gencode flags would compile a second, different list: the target property decides.
  string(REGEX REPLACE "-gencode +arch=compute_[0-9a-z]+,code=[a-z_0-9]+" "" CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS}")
  target_sources(dion PRIVATE src/cuda/fused_kernels.cu src/cuda/symmetric_kernels.cu)
  set_source_files_properties(src/cuda/fused_kernels.cu src/cuda/symmetric_kernels.cu
                              PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  set_target_properties(dion PROPERTIES CUDA_ARCHITECTURES "${_dion_archs}")
  target_compile_definitions(dion PUBLIC DION_HAVE_CUDA)
  message(STATUS "dion: CUDA kernels enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, CUDA_ARCHITECTURES ${_dion_archs})")
endif()

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
