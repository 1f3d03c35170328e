package core

import (
	"sort"
	"sync"
)

// Note [Diagnostic sections]
//
// symmem_info_json (and so python -m symmem and symmem-info) reports what
// the library knows about itself and the machine. Packages that load
// optional libraries at run time (NCCL, NVRTC, ...) add what they found by
// registering a section from their init: RegisterInfo("nccl", fn), where fn
// returns anything encoding/json can write (found or not, version, path, why
// not). A section that expected readers look for but no package registered
// yet appears as {"status": "not built yet"}.

var (
	infoMu       sync.Mutex
	infoSections = map[string]func() any{}
)

// ExpectedInfoSections are the sections the diagnostic always shows, as
// "not built yet" until a package registers them.
var ExpectedInfoSections = []string{"nccl", "nvrtc"}

// RegisterInfo adds (or replaces) the diagnostic section name.
func RegisterInfo(name string, fn func() any) {
	infoMu.Lock()
	defer infoMu.Unlock()
	infoSections[name] = fn
}

// InfoSections runs every registered section and fills the expected ones
// that are missing.
func InfoSections() map[string]any {
	infoMu.Lock()
	names := make([]string, 0, len(infoSections))
	fns := map[string]func() any{}
	for n, fn := range infoSections {
		names = append(names, n)
		fns[n] = fn
	}
	infoMu.Unlock()
	sort.Strings(names)
	out := map[string]any{}
	for _, n := range names {
		out[n] = fns[n]()
	}
	for _, n := range ExpectedInfoSections {
		if _, ok := out[n]; !ok {
			out[n] = map[string]any{"found": false, "status": "not built yet"}
		}
	}
	return out
}
