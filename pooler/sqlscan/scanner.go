package sqlscan

// The lexical rules below are PostgreSQL's, from src/backend/parser/scan.l
// and the documentation's "SQL Syntax > Lexical Structure". Only the token
// boundaries matter here: where strings, quoted identifiers, dollar quotes
// and comments begin and end, and which bytes form a word.

// wordCap is how many bytes of an identifier the Scanner keeps: one more
// than Postgres keeps (NAMEDATALEN-1 = 63), so that truncation can see
// whether byte 63 falls inside a multibyte character.
const wordCap = maxIdentifierLen + 1

// maxIdentifierLen is NAMEDATALEN-1: Postgres truncates longer identifiers
// (truncate_identifier in src/backend/parser/scansup.c).
const maxIdentifierLen = 63

// tagCap bounds the dollar-quote tags the Scanner can match the end of.
// Postgres puts no bound on a tag; a longer one makes the text Uncertain.
const tagCap = 64

// lexState is where the lexer is between two bytes. Each state consumes
// bytes until its construct ends, then returns to lexCode (or to
// lexStringGap after a string, to follow a continuation).
type lexState uint8

const (
	lexCode             lexState = iota // between tokens
	lexWord                             // in an unquoted identifier or keyword
	lexDash                             // after '-': another '-' starts a comment
	lexSlash                            // after '/': '*' starts a comment
	lexLineComment                      // in -- ... up to a newline
	lexBlockComment                     // in /* ... */, nested to commentDepth
	lexString                           // in '...'; stringEscapes says whether backslash escapes
	lexStringBackslash                  // after a backslash in an escape string
	lexStringQuote                      // after a quote in a string: a second quote is a quote
	lexStringGap                        // after a string, in the whitespace a continuation may cross
	lexStringGapDash                    // in that whitespace, after '-'
	lexStringGapComment                 // in a -- comment in that whitespace
	lexQuotedIdent                      // in "..."
	lexQuotedIdentQuote                 // after a quote in "...": a second quote is a quote
	lexDollar                           // after '$' that may open a dollar quote; the tag so far is in word
	lexDollarBody                       // in $tag$ ... $tag$
	lexUnicodePrefix                    // after the word u followed by '&': U&'...' or U&"..."
	lexDone                             // after the NUL that ends the text, or after the end
)

// Byte classes, from scan.l: ident_start [A-Za-z\200-\377_], ident_cont
// adds [0-9\$], dolq_start and dolq_cont are the same without '$'; space is
// [ \t\n\r\f\v], newline [\n\r].
const (
	classIdentStart = 1 << iota
	classIdentCont
	classDollarTagCont
	classSpace
	classNewline
	classQuiet // in code, whitespace or a byte that is a tokOther on its own
	classPunct // '.' and ',': a tokOther too, unless a name is being read
)

var byteClass = func() (t [256]uint8) {
	for c := 0; c < 256; c++ {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_', c >= 0x80:
			t[c] = classIdentStart | classIdentCont | classDollarTagCont
		case c >= '0' && c <= '9':
			t[c] = classIdentCont | classDollarTagCont
		case c == '$':
			t[c] = classIdentCont
		}
	}
	for _, c := range []byte(" \t\f\v") {
		t[c] = classSpace
	}
	t['\n'] = classSpace | classNewline
	t['\r'] = classSpace | classNewline
	for c := 1; c < 256; c++ {
		if t[c]&(classIdentStart|classIdentCont) == 0 || c >= '0' && c <= '9' {
			t[c] |= classQuiet
		}
	}
	for _, c := range []byte("-/'\"$();.,") {
		t[c] &^= classQuiet
	}
	t['.'] |= classPunct
	t[','] |= classPunct
	return t
}()

// Scanner classifies one SQL text fed to it in pieces. The zero value is
// ready for a text; Reset readies it for the next. It keeps no reference to
// the slices passed to Write and allocates nothing.
//
// A Scanner is not safe for concurrent use; it belongs to whoever relays the
// message the text is in.
type Scanner struct {
	// StandardConformingStringsOff says the session runs with
	// standard_conforming_strings off, so that plain '...' strings take
	// backslash escapes as E'...' strings do. Postgres reports the setting
	// in ParameterStatus; lexing with the wrong value can misplace the end
	// of a string that holds a backslash. Reset keeps it.
	StandardConformingStringsOff bool

	textState // Reset zeroes it

	// The custom parameter names captured (names.go): name i is
	// nameBytes[nameEnds[i-1]:nameEnds[i]], for i below names.count. Reset
	// leaves the bytes, which the count makes unused, so that readying the
	// Scanner for a text costs no more than its state.
	nameBytes [customNameBytes]byte
	nameEnds  [maxCustomNames]uint16
}

// textState is what a Scanner knows of the text it is reading.
type textState struct {
	effects Effects
	state   lexState

	// The current word, quoted identifier or candidate dollar-quote tag:
	// its first wordCap bytes (unquoted words folded to lower case, quoted
	// ones as written with "" undone) and its full length.
	word    [wordCap]byte
	wordLen int

	stringEscapes bool // the current string takes backslash escapes
	stringText    bool // it is a plain or E'' string, not B'', X'' or U&''
	gapNewline    bool // the whitespace after a string has crossed a newline

	commentDepth int
	commentStar  bool // the last byte in a block comment was '*'
	commentSlash bool // the last byte in a block comment was '/'

	tag        [tagCap]byte // the open dollar quote's tag
	tagLen     int
	tagMatched int // bytes of the closing $tag$ matched so far

	names nameCapture // the custom parameter names the text sets

	statement
}

// Reset readies the Scanner for a new text, keeping its configuration.
func (s *Scanner) Reset() {
	s.textState = textState{}
}

// Write feeds the next piece of the text. Pieces may split the text at any
// byte. A NUL byte ends the text (Query and Parse carry it NUL-terminated);
// what follows it, in this piece or later ones, is ignored. Write never
// fails; the error is always nil, for io.Writer.
func (s *Scanner) Write(p []byte) (int, error) {
	for i := 0; i < len(p); {
		if s.state == lexDone {
			break
		}
		c := p[i]
		if c == 0 {
			s.finish()
			break
		}
		// Fast paths for the bodies of strings and comments, where most
		// bytes only need to be stepped over.
		switch s.state {
		case lexCode:
			// A run of whitespace, digits and operators other than '-' and
			// '/' classifies as a single tokOther would: each such token
			// after the first changes nothing. So do '.' and ',' while no
			// parameter name is being read (names.go); a run holds no word,
			// so none can start reading one.
			quiet := uint8(classQuiet)
			if s.nameStep == nameOff && s.callStep == callOff {
				quiet |= classPunct
			}
			other := false
			for i < len(p) {
				class := byteClass[p[i]]
				if class&quiet == 0 {
					break
				}
				other = other || class&classSpace == 0
				i++
			}
			if other {
				s.token(tokOther)
			}
			if i == len(p) || p[i] == 0 {
				continue
			}
			c = p[i]
		case lexWord:
			for i < len(p) {
				c = p[i]
				if byteClass[c]&classIdentCont == 0 {
					break
				}
				s.appendWord(foldByte(c))
				i++
			}
			if i == len(p) || c == 0 {
				continue
			}
		case lexString:
			start := i
			for i < len(p) {
				c = p[i]
				if c == '\'' || c == 0 || (c == '\\' && s.stringEscapes) {
					break
				}
				i++
			}
			s.captureString(p[start:i])
			if i == len(p) || c == 0 {
				continue
			}
		case lexLineComment:
			for i < len(p) {
				c = p[i]
				if c == '\n' || c == '\r' || c == 0 {
					break
				}
				i++
			}
			if i == len(p) || c == 0 {
				continue
			}
		case lexDollarBody:
			if s.tagMatched == 0 {
				for i < len(p) {
					c = p[i]
					if c == '$' || c == 0 {
						break
					}
					i++
				}
				if i == len(p) || c == 0 {
					continue
				}
			}
		}
		if s.step(c) {
			i++
		}
	}
	return len(p), nil
}

// Effects ends the text and reports what its statements may do. Call it
// after the last piece; Write after it is ignored until Reset.
func (s *Scanner) Effects() Effects {
	s.finish()
	return s.effects
}

// step lexes one byte and reports whether it consumed it; false means the
// byte ended a construct and must be lexed again in the new state.
func (s *Scanner) step(c byte) bool {
	class := byteClass[c]
	switch s.state {
	case lexCode:
		return s.stepCode(c, class)

	case lexWord:
		if class&classIdentCont != 0 {
			s.appendWord(foldByte(c))
			return true
		}
		if s.wordLen == 1 {
			switch s.word[0] {
			case 'e':
				// E'...' is one token (scan.l xestart), the string takes
				// backslash escapes whatever the setting.
				if c == '\'' {
					s.beginString(true, true)
					return true
				}
			case 'b', 'x':
				// B'...' and X'...' (xbstart, xhstart) never take escapes.
				if c == '\'' {
					s.beginString(false, false)
					return true
				}
			case 'u':
				if c == '&' {
					s.state = lexUnicodePrefix
					return true
				}
			}
		}
		s.token(tokWord)
		s.state = lexCode
		return false

	case lexDash:
		if c == '-' {
			s.state = lexLineComment
			return true
		}
		s.token(tokOther)
		s.state = lexCode
		return false

	case lexSlash:
		if c == '*' {
			s.state = lexBlockComment
			s.commentDepth = 1
			s.commentStar, s.commentSlash = false, false
			return true
		}
		s.token(tokOther)
		s.state = lexCode
		return false

	case lexLineComment:
		if class&classNewline != 0 {
			s.state = lexCode
		}
		return true

	case lexBlockComment:
		// Comments nest (scan.l xc): "/*" opens a level, "*/" closes one.
		// Neither overlaps the other: in "/*/" the slash after the opening
		// star does not close.
		switch {
		case c == '*' && s.commentSlash:
			s.commentDepth++
			s.commentStar, s.commentSlash = false, false
		case c == '/' && s.commentStar:
			s.commentDepth--
			s.commentStar, s.commentSlash = false, false
			if s.commentDepth == 0 {
				s.state = lexCode
			}
		default:
			s.commentStar, s.commentSlash = c == '*', c == '/'
		}
		return true

	case lexString:
		switch {
		case c == '\'':
			s.state = lexStringQuote
		case c == '\\' && s.stringEscapes:
			s.state = lexStringBackslash
			// The escape is not decoded: a name captured from this string
			// would not be the one Postgres reads.
			s.names.unusable = s.names.unusable || s.names.capturing
		default:
			s.captureString([]byte{c})
		}
		return true

	case lexStringBackslash:
		s.state = lexString
		return true

	case lexStringQuote:
		if c == '\'' {
			s.state = lexString // '' is a quote inside the string
			s.captureString([]byte{c})
			return true
		}
		s.state = lexStringGap
		s.gapNewline = false
		return false

	case lexStringGap:
		// Two strings separated only by whitespace that includes a newline
		// are one string (scan.l quotecontinue), and the second part is
		// lexed like the first: after E'...' it takes backslash escapes
		// even without its own E. Comments with -- may sit in between;
		// /* */ comments may not.
		switch {
		case class&classNewline != 0:
			s.gapNewline = true
			return true
		case class&classSpace != 0:
			return true
		case c == '-':
			s.state = lexStringGapDash
			return true
		case c == '\'' && s.gapNewline:
			s.state = lexString
			return true
		}
		s.state = lexCode
		return false

	case lexStringGapDash:
		if c == '-' {
			s.state = lexStringGapComment
			return true
		}
		s.token(tokOther) // the '-' was an operator
		s.state = lexCode
		return false

	case lexStringGapComment:
		if class&classNewline != 0 {
			s.gapNewline = true
			s.state = lexStringGap
		}
		return true

	case lexQuotedIdent:
		if c == '"' {
			s.state = lexQuotedIdentQuote
		} else {
			s.appendWord(c)
		}
		return true

	case lexQuotedIdentQuote:
		if c == '"' {
			s.appendWord('"')
			s.state = lexQuotedIdent
			return true
		}
		s.token(tokQuotedIdent)
		s.state = lexCode
		return false

	case lexDollar:
		return s.stepDollar(c, class)

	case lexDollarBody:
		// The body ends at the first "$tag$" (scan.l xdolq: a delimiter
		// with another tag gives back its last '$', which may begin ours).
		// The tag holds no '$', so after a mismatch the only partial match
		// left is a '$' just read.
		if c == s.closingDelimiterByte(s.tagMatched) {
			s.tagMatched++
			if s.tagMatched == s.tagLen+2 {
				s.state = lexCode
			}
		} else if c == '$' {
			s.tagMatched = 1
		} else {
			s.tagMatched = 0
		}
		return true

	case lexUnicodePrefix:
		switch c {
		case '\'':
			// U&'...' never takes backslash escapes: its escapes are
			// Unicode ones, and standard_conforming_strings off rejects it.
			s.beginString(false, false)
			return true
		case '"':
			// A U&"identifier" may spell any name with escapes, and its
			// UESCAPE character comes after it: nothing here can say
			// which name it is.
			s.effects |= Uncertain
			s.wordLen = 0
			s.state = lexQuotedIdent
			return true
		}
		s.token(tokWord) // u
		s.token(tokOther)
		s.state = lexCode
		return false
	}
	return true // lexDone
}

func (s *Scanner) stepCode(c byte, class uint8) bool {
	switch {
	case class&classSpace != 0:
	case class&classIdentStart != 0:
		s.wordLen = 0
		s.appendWord(foldByte(c))
		s.state = lexWord
	case c == '\'':
		s.beginString(s.StandardConformingStringsOff, true)
	case c == '"':
		s.wordLen = 0
		s.state = lexQuotedIdent
	case c == '$':
		s.wordLen = 0
		s.state = lexDollar
	case c == '-':
		s.state = lexDash
	case c == '/':
		s.state = lexSlash
	case c == '(':
		s.token(tokOpenParen)
	case c == ')':
		s.token(tokCloseParen)
	case c == ';':
		s.token(tokSemicolon)
	case c == '.':
		s.token(tokDot)
	case c == ',':
		s.token(tokComma)
	default:
		// Digits, operators, punctuation. A digit never starts a word, so
		// "$1" is '$' then a number: a parameter, never a dollar quote.
		s.token(tokOther)
	}
	return true
}

// stepDollar follows a '$' seen in code. "$$" and "$tag$" open a dollar
// quote (tags are dolq_start dolq_cont*, case-sensitive); anything else
// makes the '$' a token of its own and the tag characters an identifier,
// as scan.l's dolqfailed rule gives them back.
func (s *Scanner) stepDollar(c byte, class uint8) bool {
	if c == '$' {
		if s.wordLen > tagCap {
			s.effects |= Uncertain
			s.state = lexDone
			return true
		}
		s.tagLen = copy(s.tag[:], s.word[:s.wordLen])
		s.tagMatched = 0
		s.state = lexDollarBody
		s.stringText = false // its body is not captured: a name in it is not known
		s.token(tokString)
		return true
	}
	if s.wordLen == 0 {
		if class&classIdentStart != 0 {
			s.appendWord(c)
			return true
		}
		s.token(tokOther)
		s.state = lexCode
		return false
	}
	if class&classDollarTagCont != 0 {
		s.appendWord(c)
		return true
	}
	s.token(tokOther) // the '$'
	for i := range min(s.wordLen, wordCap) {
		s.word[i] = foldByte(s.word[i])
	}
	s.state = lexWord
	return false
}

// closingDelimiterByte is byte i of "$tag$".
func (s *Scanner) closingDelimiterByte(i int) byte {
	if i == 0 || i == s.tagLen+1 {
		return '$'
	}
	return s.tag[i-1]
}

// beginString starts a string constant: escapes says whether it takes
// backslash escapes, text whether its bytes (escapes aside) are its value.
func (s *Scanner) beginString(escapes, text bool) {
	s.stringEscapes = escapes
	s.stringText = text
	s.state = lexString
	s.token(tokString)
}

func (s *Scanner) appendWord(c byte) {
	if s.wordLen < wordCap {
		s.word[s.wordLen] = c
	}
	s.wordLen++
}

// foldByte lower-cases ASCII letters, as Postgres folds unquoted
// identifiers (downcase_identifier in scansup.c). Bytes from 0x80 up are
// left alone, which is what Postgres does in a multibyte server encoding
// such as UTF-8.
func foldByte(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + ('a' - 'A')
	}
	return c
}

// finish ends the text: a token still open at the end is emitted, then the
// last statement is closed. It is idempotent.
func (s *Scanner) finish() {
	switch s.state {
	case lexDone:
		return
	case lexWord:
		s.token(tokWord)
	case lexDash, lexSlash, lexStringGapDash:
		s.token(tokOther)
	case lexQuotedIdentQuote:
		s.token(tokQuotedIdent)
	case lexUnicodePrefix:
		s.token(tokWord)
		s.token(tokOther)
	case lexDollar:
		s.token(tokOther)
		if s.wordLen > 0 {
			for i := range min(s.wordLen, wordCap) {
				s.word[i] = foldByte(s.word[i])
			}
			s.token(tokWord)
		}
	}
	// An unterminated string, quoted identifier, dollar quote or comment
	// is a syntax error: Postgres runs none of the text, so nothing more
	// needs flagging.
	if s.nameStep != nameOff || s.callStep != callOff {
		s.endNames()
	}
	s.endStatement()
	s.state = lexDone
}
