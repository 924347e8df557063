# Copies one kiln header to its public form (cmake/kiln_package.cmake): includes of kiln's own
# headers by source-tree path become includes under kiln/, everything else is left as it is.
#
#   cmake -DIN=ops/ops.h -DOUT=build/include/kiln/ops/ops.h -DLAYERS=runtime,ops,... -P <this>
#   #include "runtime/tensor.h"   ->   #include "kiln/runtime/tensor.h"

string(REPLACE "," "|" layers "${LAYERS}")
file(READ "${IN}" text)
string(REGEX REPLACE "#include \"(${layers})/" "#include \"kiln/\\1/" text "${text}")
file(WRITE "${OUT}" "${text}")
