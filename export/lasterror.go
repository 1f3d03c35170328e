package main

/*
#include "internal.h"
*/
import "C"

import "github.com/libsymmem/libsymmem/core"

// lastError is the calling thread's last error as the C functions of
// errors.c see it (the guard's tests read it; the caller locks its OS
// thread).
func lastError() (core.Code, string) {
	return core.Code(C.symmem_last_error()), C.GoString(C.symmem_last_error_message())
}
