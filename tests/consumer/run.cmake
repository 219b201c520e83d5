# tests/consumer/run.cmake — ctest `install_consumer`: install the built project into a
# temporary prefix, then configure, build and run tests/consumer against it, as a user would.
#
#   cmake -DBUILD_DIR=build -DSOURCE_DIR=. -DWORK_DIR=build/consumer-test \
#         -DTORCH_PREFIX=<torch.utils.cmake_prefix_path> -P tests/consumer/run.cmake
#
# Checks, in order (each failure says which):
#   1. `cmake --install BUILD_DIR --prefix WORK_DIR/prefix` succeeds;
#   2. the exported target files carry nothing of this build: no dion_warnings / -Werror /
#      -ffp-contract, no precompiled headers, no path into the source tree or this torch;
#   3. find_package(dion) without torch's prefix fails with the message that says which prefix
#      to pass (skipped if this machine finds Torch without it);
#   4. with it, the consumer configures and builds, and no compile command has -Werror;
#   5. the consumer runs and exits 0 (the train_mlp setup trains; dion::comm and dion::data work).
# Needs the targets installed to be built already (ctest runs after the build).
cmake_minimum_required(VERSION 3.25)
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR TORCH_PREFIX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake: pass -D${var}=...")
  endif()
endforeach()

function(step_run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: ${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "install_consumer: ${what}: ok")
endfunction()

set(prefix "${WORK_DIR}/prefix")
set(cbuild "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# ---------------------------------------------------------------------------- 1. install
step_run("cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")

# ---------------------------------------------------------------------------- 2. exported files
file(GLOB target_files "${prefix}/lib*/cmake/dion/dionTargets*.cmake")
if(NOT target_files)
  message(FATAL_ERROR "install_consumer: no lib/cmake/dion/dionTargets*.cmake under ${prefix}")
endif()
get_filename_component(torch_root "${TORCH_PREFIX}/../.." ABSOLUTE)  # .../site-packages/torch
foreach(f IN LISTS target_files)
  file(READ "${f}" text)
  foreach(bad dion_warnings Werror ffp-contract PRECOMPILE_HEADERS "${SOURCE_DIR}" "${BUILD_DIR}"
              "${torch_root}")
    string(FIND "${text}" "${bad}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "install_consumer: ${f} contains '${bad}': a build-only setting leaks "
                          "to consumers (see cmake/DionInstall.cmake, dion_export_prepare)")
    endif()
  endforeach()
endforeach()
message(STATUS "install_consumer: exported targets carry no build-only settings: ok")

set(generator "")
find_program(ninja ninja)
if(ninja)
  set(generator -G Ninja)
endif()

# ---------------------------------------------------------------------------- 3. no torch prefix
execute_process(
  COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/no-torch" ${generator}
          -DCMAKE_PREFIX_PATH=${prefix}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(STATUS "install_consumer: Torch is found here without its prefix: error-message check skipped")
else()
  string(FIND "${out}${err}" "torch.utils.cmake_prefix_path" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "install_consumer: without torch's prefix find_package(dion) must say "
                        "what to pass; it said:\n${out}\n${err}")
  endif()
  message(STATUS "install_consumer: without torch's prefix: the error names torch.utils.cmake_prefix_path: ok")
endif()

# ---------------------------------------------------------------------------- 4. configure + build
set(launcher "")
find_program(ccache ccache)
if(ccache)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${ccache})
endif()
# (execute_process directly: forwarding through step_run would split the list at its ';')
execute_process(
  COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${cbuild}" ${generator} ${launcher}
          -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix};${TORCH_PREFIX}"
          -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install_consumer: configuring the consumer failed (${rc}):\n${out}\n${err}")
endif()
message(STATUS "install_consumer: configure the consumer: ok")
file(READ "${cbuild}/compile_commands.json" commands)
foreach(bad Werror ffp-contract)
  string(FIND "${commands}" "${bad}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "install_consumer: the consumer's compile commands contain '${bad}':\n${commands}")
  endif()
endforeach()
step_run("build the consumer" ${CMAKE_COMMAND} --build "${cbuild}")

# ---------------------------------------------------------------------------- 5. run
execute_process(COMMAND "${cbuild}/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install_consumer: the consumer exited ${rc}")
endif()
message(STATUS "install_consumer: passed")
