package ipc

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
)

// 10 KiB group names and socket directories come back once, cut (Note
// [Bounded messages]).
func TestConfigMessagesAreBounded(t *testing.T) {
	long := strings.Repeat("g", 10240)
	for _, c := range []Config{
		{Name: long, World: 2, Dir: t.TempDir()},
		{Name: "ok", World: 2, Dir: "/" + long},
		{Name: "ok", World: 2, Dir: t.TempDir() + "/" + strings.Repeat("d", 200)},
		{Name: "ok", World: 2, Dir: t.TempDir(), Token: long},
	} {
		err := c.normalize()
		require.Error(t, err)
		msg := err.Error()
		assert.Less(t, len(msg), core.MaxMessageBytes, msg)
		assert.LessOrEqual(t, strings.Count(msg, "…"), 1, msg)
		for _, r := range []string{"g", "d"} {
			assert.NotContains(t, msg, strings.Repeat(r, core.QuoteMaxChars+1), msg)
		}
	}
	err := (&Config{Name: long, World: 2, Dir: t.TempDir()}).normalize()
	assert.Contains(t, err.Error(), `…" (10240 characters) must have 1 to 64 characters`)
	assert.Equal(t, 1, strings.Count(err.Error(), strings.Repeat("g", 64)))
}
