package core

import (
	"errors"
	"fmt"
)

// Code is a result code. The values are the C ABI's (include/symmem.h,
// enum symmem_result) and never change; codeNames below is their table
// (Note [Enum tables] in enum.go).
type Code int32

const (
	Success            Code = 0
	ErrInvalidArgument Code = 1
	ErrOutOfMemory     Code = 2
	ErrInvalidPointer  Code = 3
	ErrInvalidDevice   Code = 4
	ErrBackend         Code = 5
	ErrUnavailable     Code = 6
	ErrTimeout         Code = 7
	ErrMismatch        Code = 8
	ErrPeer            Code = 9
	ErrPermission      Code = 10
	ErrInvalidState    Code = 11
	ErrInternal        Code = 12
	ErrAborted         Code = 13
	ErrInterrupted     Code = 14
)

// NumCodes is the number of defined codes (0 .. NumCodes-1).
const NumCodes = int(ErrInterrupted) + 1

// codeNames is enum symmem_result's table (Note [Enum tables] in enum.go):
// the C name and the fixed description (String, symmem_strerror).
var codeNames = [NumCodes]EnumName{
	Success:            {"SYMMEM_SUCCESS", "success"},
	ErrInvalidArgument: {"SYMMEM_ERROR_INVALID_ARGUMENT", "invalid argument"},
	ErrOutOfMemory:     {"SYMMEM_ERROR_OUT_OF_MEMORY", "out of memory"},
	ErrInvalidPointer:  {"SYMMEM_ERROR_INVALID_POINTER", "invalid pointer"},
	ErrInvalidDevice:   {"SYMMEM_ERROR_INVALID_DEVICE", "invalid device"},
	ErrBackend:         {"SYMMEM_ERROR_BACKEND", "backend error"},
	ErrUnavailable:     {"SYMMEM_ERROR_UNAVAILABLE", "unavailable"},
	ErrTimeout:         {"SYMMEM_ERROR_TIMEOUT", "timed out"},
	ErrMismatch:        {"SYMMEM_ERROR_MISMATCH", "mismatch between ranks"},
	ErrPeer:            {"SYMMEM_ERROR_PEER", "peer failed"},
	ErrPermission:      {"SYMMEM_ERROR_PERMISSION", "permission denied"},
	ErrInvalidState:    {"SYMMEM_ERROR_INVALID_STATE", "invalid state"},
	ErrInternal:        {"SYMMEM_ERROR_INTERNAL", "internal error"},
	ErrAborted:         {"SYMMEM_ERROR_ABORTED", "aborted"},
	ErrInterrupted:     {"SYMMEM_ERROR_INTERRUPTED", "interrupted"},
}

// String is the fixed description of a code; it works for unknown codes.
func (c Code) String() string {
	if c >= 0 && int(c) < len(codeNames) {
		return codeNames[c].Name
	}
	return fmt.Sprintf("unknown result %d", int32(c))
}

// Error is every error that core returns: a code and a message that says
// what failed and where.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Errorf makes an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// CodeOf extracts the code of err: Success for nil, the code of a wrapped
// *Error, ErrInternal otherwise.
func CodeOf(err error) Code {
	if err == nil {
		return Success
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ErrInternal
}
