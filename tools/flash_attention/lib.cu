// libkf.so: fa_lib.h's C API (kf_launch, kf_error, kf_info) for bench.py.
#include "fa_lib.h"
