package sqlscan

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// result is everything a Scanner reports about a text.
type result struct {
	effects     Effects
	name        string
	all, ok     bool
	customNames string // joined by ","
}

func resultOf(s *Scanner) result {
	effects := s.Effects()
	name, all, ok := s.SingleDeallocate()
	return result{effects, string(name), all, ok, customNames(s)}
}

// FuzzScanner checks that how a text is split never changes what the
// Scanner reports, that a NUL ends the text, that the custom names it
// captures are custom ones within its bounds, and that nothing panics.
func FuzzScanner(f *testing.F) {
	for _, group := range [][]effectsCase{settingCases, sessionCases, trapCases, uncertainCases} {
		for i, tc := range group {
			f.Add([]byte(tc.text), uint64(i), false)
		}
	}
	for i, tc := range namesCases {
		f.Add([]byte(tc.text), uint64(i), i%2 == 0)
	}
	f.Add([]byte("DEALLOCATE \"a\"\"b\";"), uint64(7), false)
	f.Add([]byte("SELECT 'a\\''; SET x = 1; --'"), uint64(3), true)
	f.Add(insertText(4<<10), uint64(1), false)
	f.Fuzz(func(t *testing.T, text []byte, seed uint64, standardOff bool) {
		whole := Scanner{StandardConformingStringsOff: standardOff}
		whole.Write(text)
		want := resultOf(&whole)
		if want.ok && want.effects&Deallocate == 0 {
			t.Fatalf("%q: a single DEALLOCATE without the Deallocate effect (%v)", text, want.effects)
		}
		checkCustomNames(t, text, &whole)

		rng := rand.New(rand.NewPCG(seed, uint64(len(text))))
		split := Scanner{StandardConformingStringsOff: standardOff}
		for rest := text; len(rest) > 0; {
			n := min(len(rest), rng.IntN(len(text)/2+2))
			split.Write(rest[:n])
			rest = rest[n:]
		}
		if got := resultOf(&split); got != want {
			t.Fatalf("%q in random pieces (seed %d): %+v, in one piece %+v", text, seed, got, want)
		}

		// What follows a NUL does not count.
		var upToNUL []byte
		if i := bytes.IndexByte(text, 0); i >= 0 {
			upToNUL = text[:i]
		} else {
			upToNUL = text
		}
		cut := Scanner{StandardConformingStringsOff: standardOff}
		cut.Write(upToNUL)
		cut.Write([]byte{0})
		cut.Write([]byte("; SET x = 1; LISTEN y"))
		if got := resultOf(&cut); got != want {
			t.Fatalf("%q ended by a NUL: %+v, without it %+v", text, got, want)
		}
	})
}

// checkCustomNames checks what a Scanner that has read text captured: at
// most maxCustomNames names, each with a dot and named once, and only in a
// text that SetsSetting.
func checkCustomNames(t *testing.T, text []byte, s *Scanner) {
	t.Helper()
	n := s.NumCustomNames()
	if n > maxCustomNames {
		t.Fatalf("%q: %d names, more than %d", text, n, maxCustomNames)
	}
	if (n > 0 || s.Effects()&UnknownCustomName != 0) && s.Effects()&SetsSetting == 0 {
		t.Fatalf("%q: custom names (%d, %v) without SetsSetting", text, n, s.Effects())
	}
	total := 0
	for i := range n {
		name := s.CustomName(i)
		total += len(name)
		if bytes.IndexByte(name, '.') < 0 {
			t.Fatalf("%q: name %q has no dot", text, name)
		}
		for j := range i {
			if equalFoldASCII(s.CustomName(j), name) {
				t.Fatalf("%q: %q named twice", text, name)
			}
		}
	}
	if total > customNameBytes {
		t.Fatalf("%q: %d bytes of names", text, total)
	}
}
