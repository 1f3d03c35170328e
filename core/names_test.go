package core_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCoreNeverDecidesByBackendName keeps DESIGN "Capabilities, not names":
// no code of core (tests aside) compares a backend's name; differences are
// Backend.Capabilities.
func TestCoreNeverDecidesByBackendName(t *testing.T) {
	byName := regexp.MustCompile(`Name\(\)\s*[!=]=|[!=]=\s*"(host|cuda)"|"(host|cuda)"\s*[!=]=|\.backend\s*[!=]=\s*"`)
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		for i, line := range strings.Split(string(b), "\n") {
			require.Falsef(t, byName.MatchString(line), "%s:%d decides by a backend's name: %s", path, i+1, strings.TrimSpace(line))
		}
		return nil
	})
	require.NoError(t, err)
}
