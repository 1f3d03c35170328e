package core

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// VERSION is the one source of truth; the header, Go and Python must say the
// same (scripts/version.sh writes them).
func TestVersionAgrees(t *testing.T) {
	raw, err := os.ReadFile("../VERSION")
	require.NoError(t, err)
	v := strings.TrimSpace(string(raw))
	var major, minor, patch int
	_, err = fmt.Sscanf(v, "%d.%d.%d", &major, &minor, &patch)
	require.NoError(t, err, "VERSION must be MAJOR.MINOR.PATCH")
	require.Equal(t, v, VersionString, "core/version.go: run scripts/version.sh")
	require.Equal(t, major*10000+minor*100+patch, Version, "core/version.go: run scripts/version.sh")

	h, err := os.ReadFile("../include/symmem.h")
	require.NoError(t, err)
	for name, want := range map[string]int{"MAJOR": major, "MINOR": minor, "PATCH": patch} {
		m := regexp.MustCompile(`(?m)^#define SYMMEM_VERSION_` + name + ` (\d+)$`).FindSubmatch(h)
		require.NotNil(t, m, "symmem.h lacks SYMMEM_VERSION_%s", name)
		require.Equal(t, fmt.Sprint(want), string(m[1]), "include/symmem.h SYMMEM_VERSION_%s: run scripts/version.sh", name)
	}
	py, err := os.ReadFile("../python/symmem/_version.py")
	require.NoError(t, err)
	require.Contains(t, string(py), fmt.Sprintf("__version__ = %q", v), "python/symmem/_version.py: run scripts/version.sh")
	for name, want := range map[string]int{"MAJOR": major, "MINOR": minor, "PATCH": patch} {
		require.Contains(t, string(py), fmt.Sprintf("VERSION_%s = %d\n", name, want))
	}
}
