// Package include carries the device header, include/symmem_device.cuh,
// into the library: the collectives' kernels are compiled at run time with
// NVRTC, which gets the header from memory (cuda/kernels.go).
package include

import _ "embed"

// DeviceHeader is include/symmem_device.cuh.
//
//go:embed symmem_device.cuh
var DeviceHeader string
