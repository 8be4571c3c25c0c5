package sqlscan

import "bytes"

// The custom parameters a text sets ("app.tenant": a name with a dot, which
// pg_settings does not list) are captured by name, so that the pooler can
// ask the server for their values afterwards. The forms that name one are
// (gram.y VariableSetStmt, VariableResetStmt; var_name is ColId ('.'
// ColId)*):
//
//	SET [SESSION] a.b {= | TO} ...      SET a.b FROM CURRENT
//	RESET a.b
//	set_config('a.b', value, is_local)  with a string literal as the name
//
// SET LOCAL and set_config(…, TRUE) end with the transaction and capture
// nothing. Unquoted name parts are folded to lower case, quoted ones kept
// as written; each part is truncated as Postgres truncates identifiers.
// Postgres compares parameter names without regard to ASCII case
// (guc_name_compare in src/backend/utils/misc/guc.c), and so does the
// Scanner when it drops a name it already holds.

// maxCustomNames bounds the names a Scanner keeps per text, and
// customNameBytes their total length. A text that names more is
// UnknownCustomName.
const (
	maxCustomNames  = 16
	customNameBytes = 512
)

// nameCapture counts the custom parameter names a text sets (their bytes
// are in Scanner.nameBytes), and follows the one being read, which is kept
// at nameBytes[used:used+pending] until it is known to be set.
type nameCapture struct {
	count int
	used  int

	pending  int
	dotted   bool // it has a '.' (a custom name), whether or not it fit
	overflow bool // it did not fit in buf
	unusable bool // its string took a backslash escape, which is not undone
	// capturing: the lexer appends the bytes of the string being lexed to
	// the pending name (the first argument of set_config).
	capturing bool
}

// NumCustomNames ends the text and reports how many custom parameters
// (names with a dot) its statements set at session level and the Scanner
// captured, each once; see CustomName.
func (s *Scanner) NumCustomNames() int {
	s.finish()
	return s.names.count
}

// CustomName returns the i-th captured custom parameter name, in the order
// of the text, 0 <= i < NumCustomNames(): unquoted parts folded to lower
// case, quoted ones and string literals as written. It is valid until the
// next Reset.
func (s *Scanner) CustomName(i int) []byte {
	start := 0
	if i > 0 {
		start = int(s.nameEnds[i-1])
	}
	return s.nameBytes[start:s.nameEnds[i]]
}

// startName begins reading a name.
func (s *Scanner) startName() {
	n := &s.names
	n.pending, n.dotted, n.overflow, n.unusable, n.capturing = 0, false, false, false, false
}

func (s *Scanner) appendName(b []byte) {
	n := &s.names
	n.dotted = n.dotted || bytes.IndexByte(b, '.') >= 0
	if n.used+n.pending+len(b) > len(s.nameBytes) {
		n.overflow = true
		return
	}
	n.pending += copy(s.nameBytes[n.used+n.pending:], b)
}

// captureString appends bytes of a string constant to the pending name
// when the lexer is capturing one.
func (s *Scanner) captureString(b []byte) {
	if s.names.capturing {
		s.appendName(b)
	}
}

// appendNamePart appends the current word, an identifier, truncated as
// Postgres truncates it.
func (s *Scanner) appendNamePart() {
	s.appendName(s.word[:truncatedLen(s.word[:], s.wordLen)])
}

// commitName keeps the pending name if it is a custom one the text has not
// named before; a custom name that did not fit, or a string whose escapes
// may spell any name, makes the text UnknownCustomName.
func (s *Scanner) commitName() {
	n := &s.names
	n.capturing = false
	switch {
	case n.unusable:
		s.effects |= UnknownCustomName
		return
	case !n.dotted:
		return // a parameter pg_settings lists
	case n.overflow:
		s.effects |= UnknownCustomName
		return
	}
	name := s.nameBytes[n.used : n.used+n.pending]
	for i := range n.count {
		if equalFoldASCII(s.CustomName(i), name) {
			return
		}
	}
	if n.count == maxCustomNames {
		s.effects |= UnknownCustomName
		return
	}
	n.used += n.pending
	s.nameEnds[n.count] = uint16(n.used)
	n.count++
}

// dropName forgets the pending name.
func (s *Scanner) dropName() {
	s.names.capturing = false
}

// equalFoldASCII compares as Postgres compares parameter names: ASCII
// letters without regard to case, other bytes as they are.
func equalFoldASCII(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if foldByte(a[i]) != foldByte(b[i]) {
			return false
		}
	}
	return true
}

// Steps through the name after SET [SESSION] or RESET.
const (
	nameOff       = iota
	nameAfterPart // after a ColId: '.' continues the name, anything else ends it
	nameAfterDot  // after a '.': a ColId must follow
)

// beginSetName starts reading a SET or RESET name at the current token, a
// word or quoted identifier.
func (s *Scanner) beginSetName() {
	s.startName()
	s.appendNamePart()
	s.nameStep = nameAfterPart
}

// followSetName takes the next token of a SET or RESET name being read.
func (s *Scanner) followSetName(kind tokenKind) {
	switch s.nameStep {
	case nameAfterPart:
		if kind == tokDot {
			s.appendName([]byte{'.'})
			s.nameStep = nameAfterDot
			return
		}
		s.nameStep = nameOff
		s.commitName()
	case nameAfterDot:
		if kind == tokWord || kind == tokQuotedIdent {
			s.appendNamePart()
			s.nameStep = nameAfterPart
			return
		}
		s.nameStep = nameOff // a syntax error: nothing is set
		s.dropName()
	}
}

// endNames ends a SET or RESET name, or a set_config call, at the end of
// its statement.
func (s *Scanner) endNames() {
	switch s.nameStep {
	case nameAfterPart:
		s.commitName()
	case nameAfterDot:
		s.dropName()
	}
	s.nameStep = nameOff
	if s.callStep != callOff {
		s.endCall()
	}
}

// Steps through a call of set_config(setting_name, new_value, is_local)
// (src/backend/utils/misc/guc_funcs.c), by its top-level commas.
const (
	callOff        = iota
	callOpen       // after the name set_config: '(' makes it a call
	callName       // in the parentheses, before the first argument
	callNameString // after a string literal as the first argument
	callNameOther  // in a first argument that is not a lone literal
	callValue      // in the second argument
	callLocal      // before the third
	callLocalTrue  // after TRUE as the third
	callLocalOther // in a third argument that is something else, or past it
)

// beginCall follows a mention of set_config, which is a call if a '('
// follows. One inside the arguments of another is not followed: its name
// is UnknownCustomName.
func (s *Scanner) beginCall() {
	if s.callStep != callOff && s.callStep != callOpen {
		s.effects |= UnknownCustomName
		s.dropName()
		s.callStep = callOff
		return
	}
	s.callStep = callOpen
}

// followCall takes the next token of a set_config call.
func (s *Scanner) followCall(kind tokenKind) {
	if s.callStep == callOpen {
		s.callStep = callOff
		if kind == tokOpenParen {
			s.callStep, s.callDepth = callName, 1
		}
		return
	}
	top := s.callDepth == 1
	switch {
	case kind == tokCloseParen && top:
		s.endCall()
		return
	case kind == tokComma && top:
		s.names.capturing = false
		switch s.callStep {
		case callNameString:
			s.callNameKnown = true
			s.callStep = callValue
		case callName, callNameOther:
			s.callStep = callValue
		case callValue:
			s.callStep = callLocal
		default:
			s.callStep = callLocalOther
		}
		return
	case kind == tokOpenParen:
		s.callDepth++
	case kind == tokCloseParen:
		s.callDepth--
	}
	switch s.callStep {
	case callName:
		s.callStep = callNameOther
		if kind == tokString && s.stringText {
			s.startName()
			s.names.capturing = true
			s.callStep = callNameString
		}
	case callNameString:
		// The literal is part of an expression ('a' || 'b', 'a'::text):
		// its value is not the name.
		s.names.capturing = false
		s.callStep = callNameOther
	case callLocal:
		s.callStep = callLocalOther
		if kind == tokWord && s.wordIs("true") {
			s.callStep = callLocalTrue
		}
	case callLocalTrue:
		s.callStep = callLocalOther
	}
}

// endCall ends a set_config call at its closing parenthesis, or at the
// end of its statement.
func (s *Scanner) endCall() {
	switch {
	case s.callStep == callOpen:
	case s.callStep == callLocalTrue:
		s.dropName() // transaction-local
	case s.callNameKnown || s.callStep == callNameString:
		s.commitName()
	default:
		s.effects |= UnknownCustomName
	}
	s.callStep = callOff
	s.callNameKnown = false
	s.names.capturing = false
}
