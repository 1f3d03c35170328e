package core

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestQuoteKeepsShortStrings(t *testing.T) {
	assert.Equal(t, `"job-42"`, Quote("job-42"))
	assert.Equal(t, `""`, Quote(""))
	s := strings.Repeat("a", QuoteMaxChars)
	assert.Equal(t, `"`+s+`"`, Quote(s))
	assert.Equal(t, `"a\nb\x00"`, Quote("a\nb\x00"))
}

func TestQuoteCutsLongStrings(t *testing.T) {
	q := Quote(strings.Repeat("a", 3000))
	assert.Equal(t, `"`+strings.Repeat("a", QuoteMaxChars)+`…" (3000 characters)`, q)
	q = Quote(strings.Repeat("a", QuoteMaxChars+1))
	assert.True(t, strings.HasSuffix(q, `…" (65 characters)`), q)
	// Characters, not bytes: a multi-byte character is never cut in two.
	q = Quote(strings.Repeat("é", 100))
	assert.Equal(t, `"`+strings.Repeat("é", QuoteMaxChars)+`…" (100 characters)`, q)
	require.True(t, utf8.ValidString(q))
	// Escapes do not let a long string through.
	q = Quote(strings.Repeat("\x01", 10240))
	assert.Less(t, len(q), 400, q)
	assert.True(t, strings.HasSuffix(q, "(10240 characters)"), q)
}

// CheckName's message quotes the name once, cut, and stays short for any
// input.
func TestCheckNameMessagesAreBounded(t *testing.T) {
	long := strings.Repeat("n", 10240)
	for _, name := range []string{long, long + "/", "a/" + long, "", "..", strings.Repeat("é", 5000)} {
		err := CheckName("tag", name, 64)
		require.Error(t, err)
		assert.Equal(t, ErrInvalidArgument, CodeOf(err))
		assert.Less(t, len(err.Error()), 200, err.Error())
		assert.NotContains(t, err.Error(), strings.Repeat("n", QuoteMaxChars+1))
		assert.LessOrEqual(t, strings.Count(err.Error(), `"`), 2, err.Error())
	}
	assert.Contains(t, CheckName("tag", long, 64).Error(), `…" (10240 characters) must have 1 to 64 characters`)
	assert.Contains(t, CheckName("tag", "a/b", 64).Error(), `'/' at 1`)
}

// 10 KiB setting values and names come back cut, once, in short notes.
func TestSettingsMessagesAreBounded(t *testing.T) {
	long := strings.Repeat("v", 10240)
	st := ParseSettings([]string{
		"SYMMEM_HEAP_RESERVE=" + long,
		"SYMMEM_THREAD_CACHE=" + long,
		"SYMMEM_TIMEOUT_MS=" + long,
		"SYMMEM_BARRIER=" + long,
		"SYMMEM_" + strings.Repeat("N", 10240) + "=" + long,
		"SYMMEM_SOCKET_DIR=" + long,
	})
	notes := st.Notes()
	require.Len(t, notes, 5, notes)
	for _, n := range notes {
		assert.Less(t, len(n), MaxMessageBytes, n)
		assert.Contains(t, n, `…" (10240 characters)`)
		assert.Equal(t, 1, strings.Count(n, strings.Repeat("v", QuoteMaxChars)), n)
	}
	require.Error(t, st.Err())
	assert.Less(t, len(st.Err().Error()), MaxMessageBytes)
	for _, name := range []string{"SYMMEM_SOCKET_DIR", "SYMMEM_BARRIER"} {
		assert.Less(t, len(st.byName[name].Reading), 200, name)
	}
	_, err := ParseMillis(long)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `…" (10240 characters) is not a count of milliseconds`)
}
