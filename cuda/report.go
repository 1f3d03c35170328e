package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"

	"github.com/libsymmem/libsymmem/core"
)

// What the diagnostic (symmem_info_json, python -m symmem, symmem-info)
// shows about the driver and its devices. Everything here is a query:
// cuDeviceGetAttribute, cuDeviceGetP2PAttribute, cuDeviceTotalMem; nothing
// is created (multicast support in particular is only read as an attribute).

// DeviceReport describes one device.
type DeviceReport struct {
	Index             int    `json:"index"`
	Name              string `json:"name"`
	UUID              string `json:"uuid"`
	TotalMemory       uint64 `json:"total_memory"`
	ComputeCapability string `json:"compute_capability"`
	VMM               bool   `json:"vmm"`
	PosixFD           bool   `json:"posix_fd"`
	Fabric            bool   `json:"fabric"`
	Multicast         bool   `json:"multicast"`
	Error             string `json:"error,omitempty"`
}

// PeerReport describes what device From can do with device To's memory.
// Link is inferred: the driver API does not name the link, but native
// atomics between two devices come with NVLink (or NVSwitch), and plain
// peer access without them is PCIe.
type PeerReport struct {
	From            int    `json:"from"`
	To              int    `json:"to"`
	Access          bool   `json:"access"`
	NativeAtomics   bool   `json:"native_atomics"`
	PerformanceRank int    `json:"performance_rank"`
	Link            string `json:"link"`
}

// DriverReport is the driver's version, its devices and every ordered pair
// of them.
type DriverReport struct {
	Library       string         `json:"library"`
	DriverVersion string         `json:"driver_version"`
	Devices       []DeviceReport `json:"devices"`
	Peers         []PeerReport   `json:"peers"`
	Error         string         `json:"error,omitempty"`
}

func attrBool(cu C.int, attr C.int) bool {
	var v C.int
	if C.smcu_device_attribute(cu, attr, &v).res != 0 {
		return false // an attribute the driver does not know is not supported
	}
	return v != 0
}

// Report queries the driver (loading it if no backend has). A driver that
// does not load gives a report whose Error says why.
func Report() DriverReport {
	r := DriverReport{Library: LibraryPath()}
	v, err := DriverVersion()
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.DriverVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	var n C.int
	if err := check(C.smcu_device_count(&n), -1); err != nil {
		r.Error = err.Error()
		return r
	}
	for i := 0; i < int(n); i++ {
		d := DeviceReport{Index: i}
		cu, err := cuDevice(i)
		if err == nil {
			d.Name, err = DeviceName(i)
		}
		if err != nil {
			d.Error = err.Error()
			r.Devices = append(r.Devices, d)
			continue
		}
		if u, err := DeviceUUID(i); err == nil {
			d.UUID = u.String()
		}
		var total C.size_t
		if C.smcu_device_total_mem(cu, &total).res == 0 {
			d.TotalMemory = uint64(total)
		}
		var major, minor C.int
		C.smcu_device_attribute(cu, C.SM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &major)
		C.smcu_device_attribute(cu, C.SM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &minor)
		d.ComputeCapability = fmt.Sprintf("%d.%d", int(major), int(minor))
		d.VMM = attrBool(cu, C.SM_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
		d.PosixFD = attrBool(cu, C.SM_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
		d.Fabric = attrBool(cu, C.SM_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)
		d.Multicast = attrBool(cu, C.SM_CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)
		r.Devices = append(r.Devices, d)
	}
	// An empty list, not JSON null, on a machine with one GPU.
	r.Peers = []PeerReport{}
	for i := 0; i < int(n); i++ {
		for j := 0; j < int(n); j++ {
			if i == j {
				continue
			}
			p := PeerReport{From: i, To: j, Link: "none"}
			ci, e1 := cuDevice(i)
			cj, e2 := cuDevice(j)
			if e1 == nil && e2 == nil {
				var v C.int
				if C.smcu_p2p_attribute(ci, cj, C.SM_CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, &v).res == 0 {
					p.Access = v != 0
				}
				if C.smcu_p2p_attribute(ci, cj, C.SM_CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, &v).res == 0 {
					p.NativeAtomics = v != 0
				}
				if C.smcu_p2p_attribute(ci, cj, C.SM_CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, &v).res == 0 {
					p.PerformanceRank = int(v)
				}
			}
			switch {
			case p.Access && p.NativeAtomics:
				p.Link = "nvlink (inferred: native atomics)"
			case p.Access:
				p.Link = "pcie (inferred: no native atomics)"
			}
			r.Peers = append(r.Peers, p)
		}
	}
	return r
}

// The diagnostic's "nccl" and "nvrtc" sections (Note [Diagnostic sections]
// in core): asking loads them, as the diagnostic is asked for explicitly.
func init() {
	core.RegisterInfo("nccl", func() any {
		info, err := LoadNCCL()
		if err != nil {
			return map[string]any{"found": false, "error": err.Error(), "variable": EnvNCCL}
		}
		return map[string]any{"found": true, "version": info.VersionText(), "path": info.Path, "found_by": info.How,
			"peer_pointers": info.PeerPointers, "one_sided": info.OneSided, "lsa_team": info.LSATeam}
	})
	core.RegisterInfo("nvrtc", func() any {
		nv, err := LoadNVRTC()
		if err != nil {
			return map[string]any{"found": false, "error": err.Error(), "variable": EnvNVRTC}
		}
		return map[string]any{"found": true, "version": fmt.Sprintf("%d.%d", nv.Major, nv.Minor), "path": nv.Lib.Path,
			"found_by": nv.Lib.How}
	})
}
