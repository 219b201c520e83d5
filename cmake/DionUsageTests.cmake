# cmake/DionUsageTests.cmake — ctest cases for a program's command line.
#
# dion_add_usage_tests(PREFIX name TARGET target [BAD case...] [HELP regex])
#   BAD  each case "id|arguments|text": `target arguments` must exit 2 and print `text`
#        (the flag's name) -> test PREFIX.bad_args.id
#   HELP `target --help` must exit 0 and print output matching regex -> test PREFIX.help
# Tests only; builds nothing. Included by the root CMakeLists.txt when DION_BUILD_TESTS is on.
function(dion_add_usage_tests)
  cmake_parse_arguments(ARG "" "PREFIX;TARGET;HELP" "BAD" ${ARGN})
  foreach(_case IN LISTS ARG_BAD)
    string(REPLACE "|" ";" _parts "${_case}")
    list(GET _parts 0 _name)
    list(GET _parts 1 _args)
    list(GET _parts 2 _expect)
    add_test(NAME ${ARG_PREFIX}.bad_args.${_name}
             COMMAND sh -c "out=$($<TARGET_FILE:${ARG_TARGET}> ${_args} 2>&1); rc=$?; echo \"$out\"; \
[ $rc -eq 2 ] || { echo \"exit $rc, expected 2\"; exit 1; }; \
printf '%s' \"$out\" | grep -q -e '${_expect}'")
    set_tests_properties(${ARG_PREFIX}.bad_args.${_name} PROPERTIES TIMEOUT 60)
  endforeach()
  if(ARG_HELP)
    add_test(NAME ${ARG_PREFIX}.help COMMAND ${ARG_TARGET} --help)
    set_tests_properties(${ARG_PREFIX}.help PROPERTIES PASS_REGULAR_EXPRESSION "${ARG_HELP}" TIMEOUT 60)
  endif()
endfunction()
