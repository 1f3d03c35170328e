package core

// Note [Settings]
//
// Every SYMMEM_* environment variable is read here, once, by one parser, and
// nowhere else (code elsewhere asks Settings for a typed value). The reading
// is loud: a value that does not parse is an error, listed by
// Settings.Notes (so by symmem_backend_notes and the diagnostic command) and
// returned by Default, so the first allocation or group fails with it; it
// never quietly falls back to the default. A SYMMEM_* name that no setting has is noted too (a typo such as
// SYMMEM_TIMEOUT=5000 would otherwise do nothing).
//
// Formats:
//   - sizes: an integer with an optional binary suffix K, M, G, T (also KB,
//     KiB, ..., any case): 512M, 1G, 4096;
//   - booleans: 1/true/yes/on and 0/false/no/off, any case;
//   - durations in milliseconds: an integer (milliseconds) or a number with
//     a unit (ms, s, m, h: 2s, 1500ms); huge values saturate instead of
//     overflowing time.Duration;
//   - durations in seconds (SYMMEM_WAIT_REPORT_S): a number of seconds,
//     fractions allowed (0.5), or a number with a unit.
//
// A variable set to the empty string counts as unset.

import (
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// settingKind says how a variable's text is read.
type settingKind int

const (
	kindText    settingKind = iota // any text (paths, names, tokens)
	kindBool                       // 1/true/yes/on, 0/false/no/off
	kindSize                       // bytes, with K/M/G/T suffixes
	kindMillis                     // a duration, plain numbers in milliseconds
	kindSeconds                    // a duration, plain numbers in seconds
	kindMicros                     // a duration, plain numbers in microseconds
	kindBackend                    // "auto" or a registered backend's name
	kindChoice                     // one of settingSpec.choices
)

var kindNames = map[settingKind]string{
	kindText: "text", kindBool: "boolean", kindSize: "size",
	kindMillis: "duration (ms)", kindSeconds: "duration (s)", kindMicros: "duration (us)",
	kindBackend: "backend name", kindChoice: "choice",
}

// settingSpec describes one variable. positive: zero is refused (a timeout
// of 0 would make every wait fail at once).
type settingSpec struct {
	name     string
	kind     settingKind
	positive bool
	reader   string   // who reads it, when not the library itself ("python")
	choices  []string // kindChoice: the values allowed
	doc      string
}

// settingSpecs lists every variable the project reads. Add a line here to
// add a setting; read it with Current().Bool/Size/Duration/Text.
var settingSpecs = []settingSpec{
	{name: "SYMMEM_BACKEND", kind: kindBackend, doc: "which backend to open: auto, cuda or host"},
	{name: "SYMMEM_LIBCUDA", kind: kindText, doc: "path of the CUDA driver library"},
	{name: "SYMMEM_LIBNCCL", kind: kindText, doc: "path of the NCCL library"},
	{name: "SYMMEM_LIBNVRTC", kind: kindText, doc: "path of the NVRTC library"},
	{name: "SYMMEM_LIBRARY", kind: kindText, reader: "python", doc: "path of libsymmem.so for the Python package"},
	{name: "SYMMEM_PYTHON_INTERRUPTS", kind: kindBool, reader: "python", doc: "the Python package lets signals (Ctrl-C) end the library's waits (on)"},
	{name: "SYMMEM_STAGING_BYTES", kind: kindSize, reader: "python", doc: "first size of each group's staging workspace, through which symmem.torch's collectives take tensors libsymmem did not allocate (1M; grown on demand)"},
	{name: "SYMMEM_PYTHON_EXTENSION", kind: kindBool, reader: "python", doc: "the Python package calls the library through its compiled call module where it was built (on; off: ctypes only)"},
	{name: "SYMMEM_TORCH_OPS", kind: kindBool, reader: "python", doc: "symmem.torch loads the collectives' operators' C++ kernels where python -m symmem build-torch-ops built them for the installed torch (on; off: the Python kernels)"},
	{name: "SYMMEM_TORCH_OPS_DIR", kind: kindText, reader: "python", doc: "where python -m symmem build-torch-ops puts the operators' C++ kernels and symmem.torch looks for them (symmem/torch-ops in $XDG_CACHE_HOME, else ~/.cache)"},
	{name: "SYMMEM_VLLM_ALLOCATOR", kind: kindBool, reader: "python", doc: "the vLLM plugin makes vLLM's CuMemAllocator.get_instance() return libsymmem's"},
	{name: "SYMMEM_STRICT", kind: kindBool, doc: "abort on an invalid or double-freed pointer"},
	{name: "SYMMEM_THREAD_CACHE", kind: kindBool, doc: "per-thread caches of freed blocks in front of the allocator"},
	{name: "SYMMEM_TIMEOUT_MS", kind: kindMillis, positive: true, doc: "default timeout of group waits"},
	{name: "SYMMEM_SOCKET_DIR", kind: kindText, doc: "directory of rendezvous sockets"},
	{name: "SYMMEM_MACHINE_ID", kind: kindText, doc: "testing: the machine this process claims to be on, to imitate several machines on one host (never merges two real machines)"},
	{name: "SYMMEM_ALLOW_OVERLAPPING_DEVICES", kind: kindBool, doc: "let several ranks of a group share a device"},
	{name: "SYMMEM_JOB_TOKEN", kind: kindText, doc: "tells apart jobs that use the same group name"},
	{name: "SYMMEM_BACKUP_DIR", kind: kindText, doc: "directory of disk backups of paused tags (default: the temporary directory)"},
	{name: "SYMMEM_BACKUP_PIN_AHEAD", kind: kindSize, doc: "pinned host copies held ahead of a pause for tags with pinned backup, bytes per device (default: a quarter of the host memory, shared among the machine's GPUs; 0: off)"},
	{name: "SYMMEM_HEAP_RESERVE", kind: kindSize, positive: true, doc: "address space reserved per heap range"},
	{name: "SYMMEM_TRACE", kind: kindBool, doc: "print the phases of each rendezvous to stderr"},
	{name: "SYMMEM_WAIT_REPORT_S", kind: kindSeconds, doc: "interval of progress lines while a rank waits (0: off)"},
	{name: "SYMMEM_SHM_EXCHANGE", kind: kindBool, doc: "records through the shared-memory control page (off: the sockets)"},
	{name: "SYMMEM_BARRIER", kind: kindChoice, choices: []string{"linear", "dissemination"}, doc: "the host and stream barrier's algorithm"},
	{name: "SYMMEM_SHM_SPIN_US", kind: kindMicros, doc: "how long a control-page waiter spins before it sleeps"},
	{name: "SYMMEM_CACHE_DIR", kind: kindText, doc: "where compiled kernels are cached (else the user's cache directory)"},
	{name: "SYMMEM_ONE_SHOT_MAX_BYTES", kind: kindSize, doc: "largest all-reduce run one-shot in place or at 3+ ranks"},
	{name: "SYMMEM_TWO_SHOT_PULL_MIN_BYTES", kind: kindSize, doc: "smallest two-shot all-reduce whose second phase pulls"},
	{name: "SYMMEM_HIER_MIN_BYTES", kind: kindSize, doc: "smallest all-reduce run hierarchically on a group that spans machines"},
	{name: "SYMMEM_LL_MAX_BYTES", kind: kindSize, doc: "most data per rank and peer of a low-latency collective, and the size of its buffers (0: off)"},
	{name: "SYMMEM_LEAVE_SMS", kind: kindBool, doc: "auto runs every collective on the copy engines (copy_engine), leaving the SMs to the model"},
	{name: "SYMMEM_CE_ALL_GATHER_MIN_BYTES", kind: kindSize, doc: "smallest all-gather per rank that auto runs on the copy engines in a group of 2 ranks (128M)"},
	{name: "SYMMEM_CE_REDUCE_BLOCKS", kind: kindChoice, choices: []string{"1", "2", "4", "8", "16", "32", "64"}, doc: "blocks of the copy-engine reduce-scatter's and all-reduce's reduction kernel (16)"},
	{name: "SYMMEM_COLL_UNCHECKED", kind: kindBool, doc: "collectives skip the argument agreement (measuring its cost only: disagreeing ranks then compute wrong numbers)"},
	{name: "SYMMEM_SIGNAL_KERNEL", kind: kindBool, doc: "stream signals and barriers run as one small kernel where NVRTC is found (off: cuStreamBatchMemOp)"},
	{name: "SYMMEM_COLL_PDL", kind: kindBool, doc: "launch the collectives' kernels with programmatic dependent launch where the GPU has it (on)"},
	{name: "SYMMEM_QUIET", kind: kindBool, doc: "no warning line on stderr at load for SYMMEM_* variables that are no setting"},
	{name: "SYMMEM_COLL_MAX_BLOCKS", kind: kindChoice, choices: []string{"8", "16", "24", "32", "48", "64"}, doc: "most blocks a collective kernel runs on (64)"},
	// Read by the test suites, not the library (listed so that they are not
	// reported as unknown).
	{name: "SYMMEM_REQUIRE_GPU", kind: kindBool, reader: "tests", doc: "GPU tests fail instead of skipping"},
	{name: "SYMMEM_REQUIRE_NVRTC", kind: kindBool, reader: "tests", doc: "NVRTC tests fail instead of skipping"},
	{name: "SYMMEM_PARTIAL_LIBRARY", kind: kindBool, reader: "tests", doc: "symmetric tests skip on an allocator-only library"},
	{name: "SYMMEM_TEST_VIA_COPY", kind: kindBool, reader: "tests", doc: "C tests reach host memory through symmem_copy"},
	{name: "SYMMEM_GPU_TEST_TIMEOUT", kind: kindSeconds, reader: "tests", doc: "seconds a GPU test's ranks may run"},
	{name: "SYMMEM_GPU_TEST_BUDGET", kind: kindSeconds, reader: "tests", doc: "seconds test_symm_gpu.py may run in all"},
	{name: "SYMMEM_CI_CACHE", kind: kindText, reader: "ci", doc: "where .ci/run keeps NVRTC between runs"},
}

// Setting is one SYMMEM_* variable found in the environment and how it was
// read.
type Setting struct {
	Name  string
	Raw   string // the text as set
	Known bool   // a setting of this project (else a probable typo)
	Kind  string // "size", "boolean", ...
	// Reading says what the text was taken to mean ("1073741824 bytes"),
	// or why it was not.
	Reading string
	Reader  string // "library" or "python"
	Err     error  // non-nil when Raw does not parse

	b bool
	n uint64
	d time.Duration
}

// Settings is the result of reading an environment.
type Settings struct {
	byName map[string]*Setting
	order  []string // names found, sorted
}

var (
	settingsMu  sync.Mutex
	settingsCur *Settings
)

// Current returns the process's settings, read from the environment at the
// first call.
func Current() *Settings {
	settingsMu.Lock()
	defer settingsMu.Unlock()
	if settingsCur == nil {
		settingsCur = ParseSettings(os.Environ())
	}
	return settingsCur
}

// ReloadSettings reads the environment again. Only for tests that change
// variables with t.Setenv; the library reads its settings once.
func ReloadSettings() *Settings {
	settingsMu.Lock()
	defer settingsMu.Unlock()
	settingsCur = ParseSettings(os.Environ())
	return settingsCur
}

// IsSetting says whether name is one of the settings (settingSpecs).
func IsSetting(name string) bool {
	_, ok := specOf(name)
	return ok
}

func specOf(name string) (settingSpec, bool) {
	for _, s := range settingSpecs {
		if s.name == name {
			return s, true
		}
	}
	return settingSpec{}, false
}

// ParseSettings reads every SYMMEM_* variable of environ ("NAME=value").
func ParseSettings(environ []string) *Settings {
	st := &Settings{byName: map[string]*Setting{}}
	for _, kv := range environ {
		name, raw, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, "SYMMEM_") || raw == "" {
			continue
		}
		s := &Setting{Name: name, Raw: raw, Reader: "library"}
		spec, known := specOf(name)
		s.Known = known
		if !known {
			s.Kind = "unknown"
			s.Reading = "not a setting of libsymmem: ignored"
			if near := nearestSetting(name); near != "" {
				s.Reading += fmt.Sprintf(" (did you mean %s?)", near)
			}
		} else {
			s.Kind = kindNames[spec.kind]
			if spec.reader != "" {
				s.Reader = spec.reader
			}
			s.read(spec)
		}
		st.byName[name] = s
		st.order = append(st.order, name)
	}
	sort.Strings(st.order)
	return st
}

// settingName is a variable's name for a message: as it is, or quoted and
// cut when it is long (Note [Bounded messages]).
func settingName(name string) string {
	if utf8.RuneCountInString(name) <= QuoteMaxChars {
		return name
	}
	return Quote(name)
}

// read parses s.Raw as spec says, setting the typed value and Reading, or Err.
func (s *Setting) read(spec settingSpec) {
	var err error
	switch spec.kind {
	case kindText, kindBackend:
		s.Reading = Quote(s.Raw)
	case kindBool:
		if s.b, err = ParseBool(s.Raw); err == nil {
			s.Reading = strconv.FormatBool(s.b)
		}
	case kindSize:
		if s.n, err = ParseSize(s.Raw); err == nil {
			s.Reading = fmt.Sprintf("%d bytes", s.n)
			if spec.positive && s.n == 0 {
				err = fmt.Errorf("must be more than 0 bytes")
			}
		}
	case kindChoice:
		s.Reading = Quote(s.Raw)
		ok := false
		for _, c := range spec.choices {
			ok = ok || s.Raw == c
		}
		if !ok {
			err = fmt.Errorf("not one of %s", strings.Join(spec.choices, ", "))
		}
	case kindMillis, kindSeconds, kindMicros:
		unit := time.Millisecond
		switch spec.kind {
		case kindSeconds:
			unit = time.Second
		case kindMicros:
			unit = time.Microsecond
		}
		if s.d, err = ParseDuration(s.Raw, unit); err == nil {
			s.Reading = s.d.String()
			if spec.positive && s.d <= 0 {
				err = fmt.Errorf("must be more than 0")
			}
		}
	}
	if err != nil {
		s.Err = Errorf(ErrInvalidArgument, "%s=%s cannot be read as a %s: %v", s.Name, Quote(s.Raw), kindNames[spec.kind], err)
		s.Reading = "unreadable: " + err.Error()
	}
}

// nearestSetting names the known setting closest to name (edit distance at
// most 3), or "". A name whose length differs from a setting's by more than
// 3 is not compared with it: the distance is at least the difference, and a
// name of any length costs no more than a short one.
func nearestSetting(name string) string {
	best, bestD := "", 4
	for _, s := range settingSpecs {
		if len(name) > len(s.name)+3 || len(s.name) > len(name)+3 {
			continue
		}
		if d := editDistance(name, s.name); d < bestD {
			best, bestD = s.name, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// ParseBool reads 1/true/yes/on and 0/false/no/off, in any case.
func ParseBool(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("not one of 1/true/yes/on or 0/false/no/off")
}

// ParseSize reads a byte count with an optional binary suffix: 4096, 512K,
// 512M, 1G, 2T (also KB/KiB, MB/MiB, ..., any case). Overflow is an error.
func ParseSize(s string) (uint64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	shift := uint(0)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift != 0 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseUint(strings.TrimSpace(t), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not a size (examples: 4096, 512M, 1G)")
	}
	if v > math.MaxUint64>>shift {
		return 0, fmt.Errorf("more than 2^64 bytes")
	}
	return v << shift, nil
}

// ParseDuration reads a duration: a plain number counts in unit (fractions
// allowed), a number with a unit (ms, s, m, h, as Go writes them) counts in
// that unit. Negative values are errors; values beyond time.Duration's range
// saturate at its maximum.
func ParseDuration(s string, unit time.Duration) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(t, 64); err == nil {
		if f < 0 || math.IsNaN(f) {
			return 0, fmt.Errorf("negative or not a number")
		}
		return SaturatingDuration(f, unit), nil
	}
	if strings.HasPrefix(t, "-") {
		return 0, fmt.Errorf("negative")
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		if strings.Contains(err.Error(), "overflow") {
			return time.Duration(math.MaxInt64), nil
		}
		return 0, fmt.Errorf("not a number of %s nor a duration such as 2s or 1500ms", unitName(unit))
	}
	return d, nil
}

func unitName(unit time.Duration) string {
	switch unit {
	case time.Second:
		return "seconds"
	case time.Microsecond:
		return "microseconds"
	}
	return "milliseconds"
}

// SaturatingDuration is n units as a Duration, clamped to the largest
// Duration instead of overflowing.
func SaturatingDuration(n float64, unit time.Duration) time.Duration {
	v := n * float64(unit)
	if v >= math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(v)
}

// lookup returns the readable setting name, if set; it panics on a name
// that settingSpecs lacks or a kind mismatch (a bug caught by any test).
func (st *Settings) lookup(name string, kinds ...settingKind) *Setting {
	spec, ok := specOf(name)
	if !ok {
		panic("libsymmem: setting " + name + " is not in settingSpecs")
	}
	match := false
	for _, k := range kinds {
		match = match || spec.kind == k
	}
	if !match {
		panic("libsymmem: setting " + name + " read as the wrong kind")
	}
	s := st.byName[name]
	if s == nil || s.Err != nil {
		return nil
	}
	return s
}

// Bool is the boolean setting name, or def when unset or unreadable.
func (st *Settings) Bool(name string, def bool) bool {
	if s := st.lookup(name, kindBool); s != nil {
		return s.b
	}
	return def
}

// Size is the size setting name in bytes, or def.
func (st *Settings) Size(name string, def uint64) uint64 {
	if s := st.lookup(name, kindSize); s != nil {
		return s.n
	}
	return def
}

// Duration is the duration setting name, or def.
func (st *Settings) Duration(name string, def time.Duration) time.Duration {
	if s := st.lookup(name, kindMillis, kindSeconds, kindMicros); s != nil {
		return s.d
	}
	return def
}

// Text is the text setting name, or def.
func (st *Settings) Text(name string, def string) string {
	if s := st.lookup(name, kindText, kindBackend, kindChoice); s != nil {
		return s.Raw
	}
	return def
}

// All lists every SYMMEM_* variable found, by name.
func (st *Settings) All() []Setting {
	out := make([]Setting, 0, len(st.order))
	for _, n := range st.order {
		out = append(out, *st.byName[n])
	}
	return out
}

// Err is the first unreadable setting's error (nil when all read).
func (st *Settings) Err() error {
	for _, n := range st.order {
		if e := st.byName[n].Err; e != nil {
			return e
		}
	}
	return nil
}

// Warnings are the lines WarnUnknown prints: one per SYMMEM_* variable
// that is no setting, naming the nearest setting where one is close.
func (st *Settings) Warnings() []string {
	var out []string
	for _, n := range st.order {
		s := st.byName[n]
		if s.Known {
			continue
		}
		hint := "python -m symmem or symmem-info lists the settings"
		if near := nearestSetting(s.Name); near != "" {
			hint = "did you mean " + near + "?"
		}
		out = append(out, fmt.Sprintf("symmem: warning: %s=%s is not a libsymmem setting and is ignored; %s (SYMMEM_QUIET=1 silences this)",
			settingName(s.Name), Quote(s.Raw), hint))
	}
	return out
}

// WarnUnknown prints Warnings to w, one line each, unless SYMMEM_QUIET is
// set: the library does it once, when it is loaded.
func (st *Settings) WarnUnknown(w io.Writer) {
	if st.Bool("SYMMEM_QUIET", false) {
		return
	}
	for _, l := range st.Warnings() {
		io.WriteString(w, l+"\n")
	}
}

// Notes says what is wrong with the settings, one line per problem:
// unreadable values and names that are no setting.
func (st *Settings) Notes() []string {
	var out []string
	for _, n := range st.order {
		s := st.byName[n]
		switch {
		case s.Err != nil:
			out = append(out, "setting "+s.Err.Error()+" (allocations and groups fail until it is fixed)")
		case !s.Known:
			out = append(out, fmt.Sprintf("setting %s=%s: %s", settingName(s.Name), Quote(s.Raw), s.Reading))
		}
	}
	return out
}
