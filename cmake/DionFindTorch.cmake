# cmake/DionFindTorch.cmake — find_package(Torch REQUIRED), asking Python where torch is when
# CMAKE_PREFIX_PATH does not say.
#
# Included by cmake/DionTorch.cmake in place of a bare find_package(Torch). Tries, in order:
#   1. CMAKE_PREFIX_PATH / Torch_DIR as given (scripts/setup.sh passes
#      torch.utils.cmake_prefix_path; so does any user who follows the README);
#   2. `${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"`: the torch
#      that the Python module will import at run time. This is how `pip install .` finds torch:
#      scikit-build-core puts only its own environment's site-packages on CMAKE_PREFIX_PATH,
#      which in a venv made with --system-site-packages does not hold torch;
#   3. the same with `python -E` (PYTHONPATH ignored): under pip's build isolation (a plain
#      `pip install .`) the interpreter sees only the isolated build environment, which pip
#      sets up through PYTHONPATH; -E sees the environment pip was started from, where torch is.
# There is deliberately no torch in pyproject.toml's build requirements: the extension must be
# compiled against the torch it runs with, never a second copy downloaded for the build.
# Not here: which torch version is acceptable (pyproject.toml pins it for pip).

find_package(Torch QUIET)
if(NOT Torch_FOUND)
  if(Python3_EXECUTABLE)
    set(_dion_python "${Python3_EXECUTABLE}")
  else()
    find_program(_dion_python NAMES python3 python)
  endif()
  set(_dion_torch_prefix "")
  if(_dion_python)
    foreach(_dion_flags "" "-E")
      execute_process(
        COMMAND "${_dion_python}" ${_dion_flags} -c "import torch; print(torch.utils.cmake_prefix_path)"
        RESULT_VARIABLE _dion_rc OUTPUT_VARIABLE _dion_out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(_dion_rc EQUAL 0 AND IS_DIRECTORY "${_dion_out}")
        set(_dion_torch_prefix "${_dion_out}")
        message(STATUS "dion: torch's CMake prefix from `${_dion_python} ${_dion_flags} -c "
                       "'import torch; ...'`: ${_dion_torch_prefix}")
        break()
      endif()
    endforeach()
  endif()
  if(NOT _dion_torch_prefix)
    message(FATAL_ERROR
      "dion: LibTorch not found. Either pass its CMake prefix,\n"
      "  -DCMAKE_PREFIX_PATH=\"$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')\"\n"
      "or install torch into the Python that runs the build (${_dion_python}): pip install -r requirements.txt")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${_dion_torch_prefix}")
  find_package(Torch REQUIRED)
endif()
