package core

import (
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"4096": 4096, "512M": 512 << 20, "1G": 1 << 30, "1g": 1 << 30, "2GiB": 2 << 30,
		"3KB": 3 << 10, " 7T ": 7 << 40, "0": 0,
	} {
		got, err := ParseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "G", "1.5G", "-1", "1X", "20000000000T"} {
		_, err := ParseSize(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseBool(t *testing.T) {
	for _, s := range []string{"1", "true", "YES", "On"} {
		v, err := ParseBool(s)
		require.NoError(t, err)
		assert.True(t, v, s)
	}
	for _, s := range []string{"0", "false", "No", "OFF"} {
		v, err := ParseBool(s)
		require.NoError(t, err)
		assert.False(t, v, s)
	}
	_, err := ParseBool("maybe")
	assert.Error(t, err)
}

func TestParseDuration(t *testing.T) {
	d, err := ParseDuration("1500", time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, 1500*time.Millisecond, d)
	d, err = ParseDuration("2s", time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, d)
	d, err = ParseDuration("0.25", time.Second)
	require.NoError(t, err)
	assert.Equal(t, 250*time.Millisecond, d)
	// Saturates rather than overflowing into a negative duration.
	d, err = ParseDuration("99999999999999999999", time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, time.Duration(math.MaxInt64), d)
	assert.Equal(t, Forever, Millis(math.MaxInt64))
	for _, bad := range []string{"-5", "soon", "-2s"} {
		_, err := ParseDuration(bad, time.Millisecond)
		assert.Error(t, err, bad)
	}
}

func TestSettingsReadLoudly(t *testing.T) {
	st := ParseSettings([]string{
		"SYMMEM_HEAP_RESERVE=1G", "SYMMEM_STRICT=yes", "SYMMEM_TRACE=true",
		"SYMMEM_TIMEOUT_MS=2s", "PATH=/bin", "SYMMEM_SOCKET_DIR=",
	})
	assert.Equal(t, uint64(1<<30), st.Size("SYMMEM_HEAP_RESERVE", 0))
	assert.True(t, st.Bool("SYMMEM_STRICT", false))
	assert.True(t, st.Bool("SYMMEM_TRACE", false))
	assert.Equal(t, 2*time.Second, st.Duration("SYMMEM_TIMEOUT_MS", 0))
	assert.Equal(t, "dflt", st.Text("SYMMEM_SOCKET_DIR", "dflt"), "empty counts as unset")
	assert.NoError(t, st.Err())
	assert.Empty(t, st.Notes())
	require.Len(t, st.All(), 4)
	assert.Equal(t, "1073741824 bytes", st.All()[0].Reading)

	bad := ParseSettings([]string{"SYMMEM_HEAP_RESERVE=lots", "SYMMEM_STRICT=perhaps",
		"SYMMEM_TIMEOUT_MS=0", "SYMMEM_TIMOUT_MS=5", "SYMMEM_BARRIER=tree"})
	assert.Equal(t, uint64(7), bad.Size("SYMMEM_HEAP_RESERVE", 7), "unreadable: default")
	require.Error(t, bad.Err())
	assert.Equal(t, ErrInvalidArgument, CodeOf(bad.Err()))
	notes := strings.Join(bad.Notes(), "\n")
	for _, want := range []string{`SYMMEM_HEAP_RESERVE="lots"`, `SYMMEM_STRICT="perhaps"`,
		`SYMMEM_TIMEOUT_MS="0"`, "must be more than 0", "did you mean SYMMEM_TIMEOUT_MS?",
		`SYMMEM_BARRIER="tree"`, "not one of linear, dissemination"} {
		assert.Contains(t, notes, want)
	}
}

func TestMisspeltBackendIsExplained(t *testing.T) {
	_, notes, err := OpenBackend("gpu")
	require.Error(t, err)
	assert.Equal(t, ErrUnavailable, CodeOf(err))
	joined := strings.Join(notes, "\n")
	assert.Contains(t, joined, `SYMMEM_BACKEND="gpu" names no known backend`)
	assert.Contains(t, joined, "auto")
}

// Every setting in the table is read as its kind without panicking.
func TestEverySpecReadable(t *testing.T) {
	st := ParseSettings(nil)
	for _, s := range settingSpecs {
		switch s.kind {
		case kindBool:
			st.Bool(s.name, false)
		case kindSize:
			st.Size(s.name, 0)
		case kindMillis, kindSeconds, kindMicros:
			st.Duration(s.name, 0)
		default:
			st.Text(s.name, "")
		}
	}
}

// Note [Settings] holds: no code outside this parser reads a SYMMEM_*
// variable itself (such a variable would be reported as a typo, and its
// errors never), and docs/settings.md lists every setting, the library's
// and those the Python package and the tests read.
func TestSettingsReadOnlyHereAndDocumented(t *testing.T) {
	root := filepath.Join("..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "settings.md"))
	require.NoError(t, err)
	for _, s := range settingSpecs {
		if !strings.Contains(string(doc), "| `"+s.name+"` |") {
			t.Errorf("docs/settings.md has no table row for %s", s.name)
		}
	}
	direct := regexp.MustCompile(`os\.(Getenv|LookupEnv)\("SYMMEM_`)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "build" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if loc := direct.FindIndex(src); loc != nil {
			t.Errorf("%s reads a SYMMEM_ variable itself (line %d): ask core.Current()", path, 1+strings.Count(string(src[:loc[0]]), "\n"))
		}
		return nil
	})
	require.NoError(t, err)
}

// A SYMMEM_* variable that is no setting gives one warning line naming the
// nearest setting; SYMMEM_QUIET=1 silences it.
func TestUnknownSettingWarning(t *testing.T) {
	var out strings.Builder
	ParseSettings([]string{"SYMMEM_TIMEOUT=5000", "SYMMEM_TIMEOUT_MS=100", "PATH=/bin"}).WarnUnknown(&out)
	require.Equal(t, "symmem: warning: SYMMEM_TIMEOUT=\"5000\" is not a libsymmem setting and is ignored; did you mean SYMMEM_TIMEOUT_MS? (SYMMEM_QUIET=1 silences this)\n", out.String())
	out.Reset()
	ParseSettings([]string{"SYMMEM_TIMEOUT=5000", "SYMMEM_QUIET=1"}).WarnUnknown(&out)
	require.Empty(t, out.String())
	out.Reset()
	ParseSettings([]string{"SYMMEM_ZZZZZZZZZZZZ=1"}).WarnUnknown(&out)
	require.Contains(t, out.String(), "lists the settings")
	out.Reset()
	ParseSettings([]string{"SYMMEM_TIMEOUT_MS=100"}).WarnUnknown(&out)
	require.Empty(t, out.String())
}

// Every line the settings give (warnings at load, notes, errors) echoes a
// name or value of the environment through Quote: a 100,000-character name
// and value come back cut, each once, and no line reaches MaxMessageBytes
// (Note [Bounded messages]). The name also costs no edit distance over its
// whole length.
func TestSettingsMessagesBounded(t *testing.T) {
	long := strings.Repeat("v", 100_000)
	longName := "SYMMEM_" + strings.Repeat("N", 100_000)
	start := time.Now()
	st := ParseSettings([]string{longName + "=" + long, "SYMMEM_TIMEOUT=" + long, "SYMMEM_STRICT=" + long})
	var out strings.Builder
	st.WarnUnknown(&out)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, 2, "one warning per unknown name")
	lines = append(lines, st.Notes()...)
	lines = append(lines, st.Err().Error())
	for _, l := range lines {
		assert.Less(t, len(l), MaxMessageBytes, l[:min(len(l), 200)])
		assert.NotContains(t, l, strings.Repeat("v", QuoteMaxChars+1))
		assert.NotContains(t, l, strings.Repeat("N", QuoteMaxChars+1))
	}
	assert.Contains(t, lines[0], "…\" (100007 characters)=\"vvvv")
	assert.Contains(t, lines[0], "(100000 characters) is not a libsymmem setting")
	assert.Contains(t, lines[1], "SYMMEM_TIMEOUT=\"vvvv")
	assert.Contains(t, lines[1], "did you mean SYMMEM_TIMEOUT_MS?")
	assert.Less(t, time.Since(start), 2*time.Second, "a long name is not compared character by character with every setting")
}

// SYMMEM_PYTHON_INTERRUPTS is a boolean setting (read by the Python
// package): no warning calls it ignored, it reads by the boolean rule, and a
// value that is no boolean is an error like any other setting's.
func TestPythonInterruptsIsABooleanSetting(t *testing.T) {
	require.True(t, IsSetting("SYMMEM_PYTHON_INTERRUPTS"))
	for v, want := range map[string]bool{"0": false, "off": false, "False": false, "no": false, "1": true, "on": true, "YES": true} {
		st := ParseSettings([]string{"SYMMEM_PYTHON_INTERRUPTS=" + v})
		assert.Empty(t, st.Warnings(), v)
		assert.Empty(t, st.Notes(), v)
		assert.Equal(t, want, st.Bool("SYMMEM_PYTHON_INTERRUPTS", !want), v)
		require.Len(t, st.All(), 1)
		assert.Equal(t, "python", st.All()[0].Reader)
	}
	st := ParseSettings([]string{"SYMMEM_PYTHON_INTERRUPTS=sometimes"})
	require.Error(t, st.Err())
	assert.Contains(t, st.Err().Error(), `SYMMEM_PYTHON_INTERRUPTS="sometimes" cannot be read as a boolean`)
}
