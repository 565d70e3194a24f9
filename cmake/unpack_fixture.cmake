# Unpacks one xz-compressed reference fixture into the build directory, where the tests read it:
# large vocabularies are kept compressed in the tree so that a clone stays small.
# Run by the build: cmake -DXZ=... -DIN=FILE.xz -DOUT=FILE -P unpack_fixture.cmake
# The file is written beside OUT first and renamed, so an interrupted build never leaves a
# truncated fixture that a later build would take as up to date.
get_filename_component(out_dir ${OUT} DIRECTORY)
file(MAKE_DIRECTORY ${out_dir})
execute_process(COMMAND ${XZ} --decompress --stdout ${IN}
  OUTPUT_FILE ${OUT}.partial
  RESULT_VARIABLE status
  ERROR_VARIABLE message)
if(NOT status EQUAL 0)
  file(REMOVE ${OUT}.partial)
  message(FATAL_ERROR "unpacking ${IN}: xz failed (${status}): ${message}")
endif()
file(RENAME ${OUT}.partial ${OUT})
