package cuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"encoding/hex"
	"fmt"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
)

// Note [Fabric handles]
//
// Memory created with FABRIC among its handle types (Note [handle types])
// can be exported as a 64-byte fabric handle that a process on another
// machine of the same NVLink domain (a GB200 NVL72 rack; machines linked by
// NVSwitch and an IMEX daemon) imports and maps, as a POSIX file descriptor
// does on one machine. The handle is plain bytes: it travels through the
// group's all-gather (NCCL or the caller's), never through our sockets.
//
// Which GPUs share a domain is the driver's fabric cluster UUID and the
// GPU's unicast clique id (cuDeviceGetFabricClusterUuid /
// cuDeviceGetCliqueInfo, CUDA 13 drivers; NVML's nvmlDeviceGetGpuFabricInfo
// has the same, but libsymmem does not load NVML). A device names a domain
// only when both are known and its memory carries fabric handles; otherwise
// FabricDomain says why, and its ranks form teams by machine alone.

// FabricDomain names dev's NVLink domain ("<cluster uuid>/<clique id>")
// when memory created on dev carries fabric handles and the driver reports
// the fabric cluster; else "" and the reason. It settles whether fabric
// handles work by making (and releasing) one granule if no allocation has
// tried yet.
func (b *Backend) FabricDomain(dev int) (domain, why string, err error) {
	d, err := b.device(dev)
	if err != nil {
		return "", "", err
	}
	if d.fabric.Load() == fabricUntried {
		m, err := b.Create(dev, d.gran)
		if err != nil {
			return "", "", err
		}
		if err := b.Release(m); err != nil {
			return "", "", err
		}
	}
	if v, ok := d.domain.Load().(*fabricDomain); ok {
		return v.domain, v.why, nil
	}
	var v fabricDomain
	if on, why, _ := b.FabricHandles(dev); !on {
		v.why = "no fabric handles: " + why
	} else {
		var uuid [16]C.uchar
		var clique C.uint
		if st := C.smcu_fabric_domain(d.cu, &uuid[0], &clique); st.res != C.SM_CUDA_SUCCESS {
			v.why = fmt.Sprintf("the driver does not name the GPU's fabric cluster (%s: %s)", C.GoString(st.call), errorName(int(st.res)))
		} else {
			v.domain = fmt.Sprintf("%s/%d", hex.EncodeToString(C.GoBytes(unsafe.Pointer(&uuid[0]), 16)), uint(clique))
		}
	}
	d.domain.Store(&v)
	return v.domain, v.why, nil
}

// fabricDomain is FabricDomain's answer for a device.
type fabricDomain struct{ domain, why string }

// FabricHandleSize is the size of a fabric handle (CUmemFabricHandle).
const FabricHandleSize = 64

// ExportFabric returns m's fabric handle (cuMemExportToShareableHandle with
// CU_MEM_HANDLE_TYPE_FABRIC); m must have been created while fabric
// handles were on.
func (b *Backend) ExportFabric(m core.Memory) ([]byte, error) {
	d, err := b.owner("ExportFabric", m)
	if err != nil {
		return nil, err
	}
	buf := (*C.uchar)(C.calloc(1, FabricHandleSize))
	defer C.free(unsafe.Pointer(buf))
	if err := check(C.smcu_export_fabric(d.ctx, C.ulonglong(m), buf), d.ordinal); err != nil {
		return nil, err
	}
	return C.GoBytes(unsafe.Pointer(buf), FabricHandleSize), nil
}

// ImportFabric turns a peer's fabric handle into a local memory handle on
// dev (cuMemImportFromShareableHandle with CU_MEM_HANDLE_TYPE_FABRIC).
func (b *Backend) ImportFabric(dev int, h []byte) (core.Memory, error) {
	if len(h) != FabricHandleSize {
		return 0, core.Errorf(core.ErrInvalidArgument, "cuda: ImportFabric on device %d: a handle of %d bytes, fabric handles have %d", dev, len(h), FabricHandleSize)
	}
	d, err := b.device(dev)
	if err != nil {
		return 0, err
	}
	buf := (*C.uchar)(C.CBytes(h))
	defer C.free(unsafe.Pointer(buf))
	var m C.ulonglong
	if err := check(C.smcu_import_fabric(d.ctx, buf, &m), dev); err != nil {
		return 0, err
	}
	b.imported.Store(core.Memory(m), struct{}{})
	return b.track(core.Memory(m), dev), nil
}
