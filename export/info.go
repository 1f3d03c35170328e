package main

/*
#include "internal.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/ipc"
	"github.com/libsymmem/libsymmem/core/symm"
	"github.com/libsymmem/libsymmem/cuda"
)

// infoReport is the document symmem_info_json writes (see symmem.h).
type infoReport struct {
	Version       string            `json:"version"`
	VersionNumber int               `json:"version_number"`
	Library       string            `json:"library"`
	Backend       backendReport     `json:"backend"`
	Devices       []deviceReport    `json:"devices"`
	Driver        cuda.DriverReport `json:"cuda_driver"`
	Libraries     map[string]any    `json:"libraries"`
	SocketDir     socketDirReport   `json:"socket_dir"`
	Machine       machineReport     `json:"machine"`
	Settings      []settingReport   `json:"settings"`
}

// machineReport is this process's machine identity (Note [Machine
// identity] in core/symm).
type machineReport struct {
	Hostname  string `json:"hostname"`
	BootID    string `json:"boot_id"`
	Simulated string `json:"simulated,omitempty"`
	Error     string `json:"error,omitempty"`
}

type backendReport struct {
	Name  string   `json:"name"`
	Why   string   `json:"why"`
	Notes []string `json:"notes"`
	Error string   `json:"error,omitempty"`
}

type deviceReport struct {
	Index       int    `json:"index"`
	Name        string `json:"name"`
	TotalMemory uint64 `json:"total_memory"`
	FreeMemory  uint64 `json:"free_memory"`
	// FabricDomain is the device's NVLink domain where its memory carries
	// fabric handles (ranks on other machines in it map this one's memory);
	// FabricNote says why there is none (Note [Fabric handles] in cuda).
	FabricDomain string `json:"fabric_domain,omitempty"`
	FabricNote   string `json:"fabric_note,omitempty"`
	Error        string `json:"error,omitempty"`
}

// fabricDomainer is a backend that can name its devices' NVLink domain.
type fabricDomainer interface {
	FabricDomain(dev int) (domain, why string, err error)
}

type socketDirReport struct {
	Path  string `json:"path"`
	Owner int    `json:"owner_uid"`
	Mode  string `json:"mode"`
	Error string `json:"error,omitempty"`
}

type settingReport struct {
	Name    string `json:"name"`
	Value   string `json:"value"`
	Kind    string `json:"kind"`
	Reading string `json:"reading"`
	Reader  string `json:"read_by"`
	Error   string `json:"error,omitempty"`
}

func buildInfo() infoReport {
	r := infoReport{Version: core.VersionString, VersionNumber: core.Version,
		Library: C.GoString(C.symmemi_self_path())}
	if abs, err := filepath.Abs(r.Library); err == nil && r.Library != "" {
		r.Library = abs
	}
	rt, err := alloc.Default()
	r.Backend.Notes = rt.Notes
	if r.Backend.Notes == nil {
		r.Backend.Notes = []string{}
	}
	if err != nil {
		r.Backend.Error = err.Error()
	}
	want := core.Current().Text("SYMMEM_BACKEND", "auto")
	if rt.Backend == nil {
		r.Backend.Name = "none"
		r.Backend.Why = "no backend could be opened (see notes)"
	} else {
		r.Backend.Name = rt.Backend.Name()
		if want == "auto" {
			r.Backend.Why = "automatic selection: the first backend that opened, in priority order (cuda before host)"
		} else {
			r.Backend.Why = fmt.Sprintf("SYMMEM_BACKEND=%s", want)
		}
		for d := 0; d < rt.Backend.DeviceCount(); d++ {
			dr := deviceReport{Index: d, Name: rt.Backend.Name()}
			free, total, err := rt.Backend.MemoryInfo(d)
			if err != nil {
				dr.Error = err.Error()
			}
			dr.FreeMemory, dr.TotalMemory = free, total
			if f, ok := rt.Backend.(fabricDomainer); ok {
				if dom, why, err := f.FabricDomain(d); err != nil {
					dr.FabricNote = err.Error()
				} else {
					dr.FabricDomain, dr.FabricNote = dom, why
				}
			}
			r.Devices = append(r.Devices, dr)
		}
	}
	r.Driver = cuda.Report()
	for i := range r.Devices {
		if rt.Backend != nil && rt.Backend.Name() == "cuda" && i < len(r.Driver.Devices) {
			r.Devices[i].Name = r.Driver.Devices[i].Name
		}
	}
	r.Libraries = core.InfoSections()
	m := symm.ThisMachine()
	r.Machine = machineReport{Hostname: m.Hostname, BootID: m.BootID, Simulated: m.Simulated}
	if m.Err != nil {
		r.Machine.Error = m.Err.Error()
	}
	dir, err := ipc.SocketDir()
	r.SocketDir.Path = dir
	if err != nil {
		r.SocketDir.Error = err.Error()
	}
	if st, err := os.Stat(dir); err == nil {
		r.SocketDir.Mode = fmt.Sprintf("%#o", st.Mode().Perm())
		r.SocketDir.Owner = ownerOf(st)
	}
	if abs, err := filepath.Abs(dir); err == nil {
		r.SocketDir.Path = abs
	}
	for _, s := range core.Current().All() {
		sr := settingReport{Name: s.Name, Value: s.Raw, Kind: s.Kind, Reading: s.Reading, Reader: s.Reader}
		if s.Err != nil {
			sr.Error = s.Err.Error()
		}
		r.Settings = append(r.Settings, sr)
	}
	if r.Settings == nil {
		r.Settings = []settingReport{}
	}
	if r.Devices == nil {
		r.Devices = []deviceReport{}
	}
	return r
}

//export symmemgo_info_json
func symmemgo_info_json(buf *C.char, length C.size_t) (result C.size_t) {
	defer recoverCall("symmem_info_json", &result, 0)
	b, err := json.MarshalIndent(buildInfo(), "", "  ")
	if err != nil {
		setLastError("symmem_info_json", core.Errorf(core.ErrInternal, "%v", err))
		return 0
	}
	return copyOut(b, buf, length)
}
