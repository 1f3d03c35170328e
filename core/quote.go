package core

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Note [Bounded messages]
//
// Error messages echo what the caller passed (group names, tags, paths,
// setting values) so that the caller can see which input was wrong, but a
// message must stay readable whatever was passed: a 3000-character name
// would otherwise come back whole, once per place that quotes it. So every
// user-supplied string goes into a message through Quote, which keeps its
// first QuoteMaxChars characters and states the full length, and each such
// string is quoted once per message (the call's description quotes the
// arguments; the error after it says what is wrong with them without
// quoting them again). With that, messages stay under MaxMessageBytes
// except those that list a value per rank, which say so where they are
// documented (include/symmem.h).

// QuoteMaxChars is how many characters of a user-supplied string a message
// shows.
const QuoteMaxChars = 64

// MaxMessageBytes bounds a message that lists nothing per rank.
const MaxMessageBytes = 1024

// Quote is s as a Go-quoted string for a message, cut at QuoteMaxChars
// characters (runes; bytes that are not UTF-8 count one each), in which case
// it ends in "…" inside the quotes and is followed by the full length:
// "aaaa…" (3000 characters).
func Quote(s string) string {
	n, cut := 0, len(s)
	for i := 0; i < len(s); {
		if n == QuoteMaxChars {
			cut = i
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
		n++
	}
	if n <= QuoteMaxChars {
		return strconv.Quote(s)
	}
	q := strconv.Quote(s[:cut])
	return fmt.Sprintf("%s…\" (%d characters)", q[:len(q)-1], n)
}

// CheckName checks a short name (group names, tags): 1..maxLen letters,
// digits, '.', '_', '-', and not "." or "..". what names the kind of name in
// the error ("group name", "tag"), which quotes the name cut to a readable
// length (Quote; the calls' descriptions leave names to these errors, Note
// [Bounded messages]).
func CheckName(what, name string, maxLen int) error {
	if len(name) == 0 || len(name) > maxLen {
		return Errorf(ErrInvalidArgument, "%s %s must have 1 to %d characters", what, Quote(name), maxLen)
	}
	if name == "." || name == ".." {
		return Errorf(ErrInvalidArgument, "%s %q is not allowed", what, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return Errorf(ErrInvalidArgument, "%s %s has the character %q at %d: only letters, digits, '.', '_' and '-' are allowed", what, Quote(name), c, i)
		}
	}
	return nil
}
