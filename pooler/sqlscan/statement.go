package sqlscan

// tokenKind is what the lexer hands the statement classifier. Whitespace
// and comments are not tokens; numbers and operators are tokOther, since
// nothing here looks inside them, except '.' and ',': they separate the
// parts of a parameter name and the arguments of set_config (names.go).
type tokenKind uint8

const (
	tokWord        tokenKind = iota + 1 // unquoted identifier or keyword, folded, in Scanner.word
	tokQuotedIdent                      // "quoted identifier", as written, in Scanner.word
	tokString                           // any string constant, at its opening quote
	tokOpenParen
	tokCloseParen
	tokSemicolon
	tokDot
	tokComma
	tokOther
)

// leadKind is what a statement's leading keywords have made of it so far.
type leadKind uint8

const (
	leadNone               leadKind = iota // no token yet, or only '('
	leadOther                              // nothing more to learn from the leading words
	leadSet                                // SET
	leadSetScoped                          // SET LOCAL, SET TRANSACTION, SET CONSTRAINTS
	leadSetSession                         // SET SESSION
	leadReset                              // RESET
	leadDiscard                            // DISCARD
	leadPrepare                            // PREPARE
	leadPrepareTransaction                 // PREPARE TRANSACTION
	leadDeallocate                         // DEALLOCATE, see deallocStep
	leadDeclare                            // DECLARE: look for WITH HOLD
	leadCreate                             // CREATE, see createStep
	leadExplain                            // EXPLAIN: the explained statement leads next
)

// Steps through CREATE [OR REPLACE] [GLOBAL | LOCAL] {TEMP | TEMPORARY}.
const (
	createStart         = iota // after CREATE
	createAfterOr              // after CREATE OR
	createAfterReplace         // after CREATE OR REPLACE
	createAfterLocality        // after GLOBAL or LOCAL
)

// Steps through DEALLOCATE [PREPARE] {name | ALL} (gram.y DeallocateStmt).
const (
	deallocStart        = iota // after DEALLOCATE
	deallocAfterPrepare        // after DEALLOCATE PREPARE: a name, ALL, or the end (a statement named "prepare")
	deallocComplete            // the name or ALL is in: only the end may follow
	deallocInvalid             // not the plain form: the pooler must not answer it
)

// Steps through INTO [GLOBAL | LOCAL] {TEMP | TEMPORARY}, in any statement.
const (
	intoNone = iota
	intoAfterInto
	intoAfterLocality
)

// statement is the classifier's state: the current statement's, reset at
// each ';', and the text's (statement count, the DEALLOCATE name).
type statement struct {
	lead        leadKind
	leadStep    uint8 // createStep or deallocStep, by lead
	into        uint8
	explainDeep int32 // parenthesis depth inside EXPLAIN's option list
	tokens      int   // tokens of the current statement, ';' excepted
	afterWith   bool  // the last token was the word WITH
	sawUpdate   bool  // the word UPDATE appeared in the statement
	sawSettings bool  // the name pg_settings appeared in the statement

	nameStep      uint8 // reading a SET or RESET name (followSetName)
	callStep      uint8 // in a call of set_config (followCall)
	callNameKnown bool  // its first argument was a lone string literal
	callDepth     int32 // parenthesis depth inside the call

	statements int // non-empty statements ended so far

	deallocName [maxIdentifierLen]byte
	deallocLen  int
	deallocAll  bool
	deallocOK   bool // the last DEALLOCATE statement was the plain form
}

// SingleDeallocate ends the text and reports whether it is exactly one
// statement (empty statements aside) of the form DEALLOCATE [PREPARE] name
// or DEALLOCATE [PREPARE] ALL, so that the pooler may answer it itself for
// statements it renamed. name is the statement name as Postgres resolves
// it: unquoted names folded to lower case, quoted ones as written with ""
// undone, both truncated to 63 bytes at a character boundary. name is valid
// until the next Write or Reset.
//
// Postgres's protocol-level statement names are truncated too, at byte 63
// (they are keys of a NAMEDATALEN hash table), so the two agree unless a
// multibyte character straddles byte 63.
func (s *Scanner) SingleDeallocate() (name []byte, all bool, ok bool) {
	s.finish()
	if s.statements != 1 || !s.deallocOK || s.effects&Uncertain != 0 {
		return nil, false, false
	}
	if s.deallocAll {
		return nil, true, true
	}
	return s.deallocName[:s.deallocLen], false, true
}

// token classifies one token of the current statement.
func (s *Scanner) token(kind tokenKind) {
	if kind == tokSemicolon {
		if s.nameStep != nameOff || s.callStep != callOff {
			s.endNames()
		}
		s.endStatement()
		return
	}
	s.tokens++
	if s.nameStep != nameOff {
		s.followSetName(kind)
	}
	if s.callStep != callOff {
		s.followCall(kind)
	}
	if kind == tokDot || kind == tokComma {
		kind = tokOther // nothing below tells them apart
	}
	if kind == tokOther && s.lead == leadOther {
		// The common case in long texts: nothing left to learn.
		s.into = intoNone
		s.afterWith = false
		return
	}
	if kind == tokWord || kind == tokQuotedIdent {
		s.checkName(kind)
	}
	s.checkInto(kind)
	s.advanceLead(kind)
	s.afterWith = kind == tokWord && s.wordIs("with")
}

// wordIs reports whether the current token's word is keyword, which must be
// lower case. Callers check that the token is a tokWord: keywords are never
// quoted.
func (s *Scanner) wordIs(keyword string) bool {
	return s.wordLen == len(keyword) && string(s.word[:s.wordLen]) == keyword
}

func (s *Scanner) advanceLead(kind tokenKind) {
	word := kind == tokWord
	switch s.lead {
	case leadNone:
		switch {
		case kind == tokOpenParen:
			// (SELECT ...): the statement proper starts inside.
		case word:
			s.beginStatement()
		default:
			s.lead = leadOther
		}

	case leadExplain:
		// EXPLAIN [ANALYZE] [VERBOSE] stmt, or EXPLAIN (options) stmt.
		// ANALYZE runs the statement, so whatever it is counts.
		switch {
		case s.explainDeep > 0:
			if kind == tokOpenParen {
				s.explainDeep++
			} else if kind == tokCloseParen {
				s.explainDeep--
			}
		case kind == tokOpenParen:
			s.explainDeep = 1
		case word && (s.wordIs("analyze") || s.wordIs("analyse") || s.wordIs("verbose")):
		case word:
			s.beginStatement()
		default:
			s.lead = leadOther
		}

	case leadSet:
		// The word after SET may begin the setting's name even when it is
		// LOCAL or SESSION (below): the name is read from it on.
		if word || kind == tokQuotedIdent {
			s.beginSetName()
		}
		if word && (s.wordIs("local") || s.wordIs("transaction") || s.wordIs("constraints")) {
			s.lead = leadSetScoped
			return
		}
		if word && s.wordIs("session") {
			s.lead = leadSetSession
			return
		}
		s.effects |= SetsSetting
		s.lead = leadOther

	case leadSetScoped:
		// SET LOCAL name ..., SET TRANSACTION ISOLATION ..., SET
		// CONSTRAINTS ALL: a word follows. LOCAL and TRANSACTION are not
		// reserved, so in "SET local.x = 1" the word is the first part of a
		// setting's name, and that SET is a session one.
		if !word && kind != tokQuotedIdent {
			s.effects |= SetsSetting
		}
		s.lead = leadOther

	case leadSetSession:
		// SET SESSION name ..., unless SESSION began the name
		// ("SET session.x = 1", read on as that name).
		s.effects |= SetsSetting
		s.lead = leadOther
		if (word || kind == tokQuotedIdent) && s.nameStep == nameOff {
			s.beginSetName()
		}

	case leadReset:
		if word && s.wordIs("all") {
			s.effects |= ResetsAll
		} else {
			s.effects |= SetsSetting
			if word || kind == tokQuotedIdent {
				s.beginSetName()
			}
		}
		s.lead = leadOther

	case leadDiscard:
		if word {
			switch {
			case s.wordIs("all"):
				s.effects |= DiscardAll | ResetsAll
			case s.wordIs("plans"), s.wordIs("sequences"), s.wordIs("temp"), s.wordIs("temporary"):
				s.effects |= DiscardOther
			}
		}
		s.lead = leadOther

	case leadPrepare:
		if word && s.wordIs("transaction") {
			s.lead = leadPrepareTransaction
			return
		}
		s.effects |= Prepare
		s.lead = leadOther

	case leadPrepareTransaction:
		// PREPARE TRANSACTION 'gid' is two-phase commit; PREPARE
		// transaction AS ... prepares a statement named "transaction".
		if kind != tokString {
			s.effects |= Prepare
		}
		s.lead = leadOther

	case leadDeallocate:
		s.advanceDeallocate(kind)

	case leadDeclare:
		if word && s.afterWith && s.wordIs("hold") {
			s.effects |= HoldCursor
		}

	case leadCreate:
		s.advanceCreate(kind)
	}
}

// beginStatement dispatches on a statement's leading keyword, the current
// word.
func (s *Scanner) beginStatement() {
	s.lead = leadOther
	switch string(s.word[:min(s.wordLen, wordCap)]) {
	case "set":
		s.lead = leadSet
	case "reset":
		s.lead = leadReset
	case "discard":
		s.lead = leadDiscard
	case "prepare":
		s.lead = leadPrepare
	case "deallocate":
		s.effects |= Deallocate
		s.lead = leadDeallocate
		s.leadStep = deallocStart
	case "listen":
		s.effects |= Listen
	case "unlisten":
		s.effects |= Unlisten
	case "declare":
		s.lead = leadDeclare
	case "close":
		s.effects |= CloseCursor
	case "do":
		s.effects |= DoBlock
	case "load":
		s.effects |= LoadLibrary
	case "create":
		s.lead = leadCreate
		s.leadStep = createStart
	case "explain":
		s.lead = leadExplain
	}
}

func (s *Scanner) advanceCreate(kind tokenKind) {
	s.lead = leadOther
	if kind != tokWord {
		return
	}
	temp := s.wordIs("temp") || s.wordIs("temporary")
	locality := s.wordIs("global") || s.wordIs("local")
	switch s.leadStep {
	case createStart:
		switch {
		case s.wordIs("or"):
			s.lead, s.leadStep = leadCreate, createAfterOr
		case locality:
			s.lead, s.leadStep = leadCreate, createAfterLocality
		case temp:
			s.effects |= TempObject
		}
	case createAfterOr:
		if s.wordIs("replace") {
			s.lead, s.leadStep = leadCreate, createAfterReplace
		}
	case createAfterReplace:
		switch {
		case locality:
			s.lead, s.leadStep = leadCreate, createAfterLocality
		case temp:
			s.effects |= TempObject
		}
	case createAfterLocality:
		if temp {
			s.effects |= TempObject
		}
	}
}

// checkInto follows SELECT ... INTO [GLOBAL | LOCAL] {TEMP | TEMPORARY}
// (gram.y OptTempTableName), which creates a temporary table. It is looked
// for in every statement; in INSERT INTO temp ... the table named temp
// costs a false positive.
func (s *Scanner) checkInto(kind tokenKind) {
	if kind != tokWord {
		s.into = intoNone
		return
	}
	temp := s.wordIs("temp") || s.wordIs("temporary")
	switch s.into {
	case intoAfterInto:
		if s.wordIs("global") || s.wordIs("local") {
			s.into = intoAfterLocality
			return
		}
		if temp {
			s.effects |= TempObject
		}
	case intoAfterLocality:
		if temp {
			s.effects |= TempObject
		}
	}
	s.into = intoNone
	if s.wordIs("into") {
		s.into = intoAfterInto
	}
}

// checkName looks for the names that matter wherever they appear, possibly
// schema-qualified (pg_catalog.set_config is the tokens pg_catalog, '.',
// set_config). Quoted names are compared without regard to case too: a
// false positive on "SET_CONFIG" is cheap.
func (s *Scanner) checkName(kind tokenKind) {
	name := s.word[:min(s.wordLen, wordCap)]
	if kind == tokQuotedIdent {
		var folded [wordCap]byte
		for i, c := range name {
			folded[i] = foldByte(c)
		}
		s.checkFoldedName(folded[:len(name)], false)
		return
	}
	s.checkFoldedName(name, true)
}

func (s *Scanner) checkFoldedName(name []byte, unquoted bool) {
	// Every name below starts with p, s or u and has six bytes or more.
	if len(name) < len("update") || name[0] != 'p' && name[0] != 's' && name[0] != 'u' {
		return
	}
	if s.wordLen <= wordCap {
		switch string(name) {
		case "set_config":
			s.effects |= SetsSetting
			s.beginCall()
		case "pg_advisory_lock", "pg_advisory_lock_shared",
			"pg_try_advisory_lock", "pg_try_advisory_lock_shared":
			s.effects |= AdvisoryLock
		case "pg_advisory_unlock", "pg_advisory_unlock_shared", "pg_advisory_unlock_all":
			s.effects |= AdvisoryUnlock
		case "pg_settings":
			s.sawSettings = true
		case "pg_temp":
			s.effects |= TempObject
		case "update":
			if unquoted {
				s.sawUpdate = true
			}
		}
	}
	if len(name) >= len("pg_temp_") && string(name[:len("pg_temp_")]) == "pg_temp_" {
		s.effects |= TempObject
	}
	if s.sawUpdate && s.sawSettings {
		s.effects |= SetsSetting
	}
}

func (s *Scanner) advanceDeallocate(kind tokenKind) {
	switch s.leadStep {
	case deallocStart:
		if kind == tokWord && s.wordIs("prepare") {
			s.deallocLen = copy(s.deallocName[:], "prepare")
			s.deallocAll = false
			s.leadStep = deallocAfterPrepare
			return
		}
		s.takeDeallocateName(kind)
	case deallocAfterPrepare:
		s.takeDeallocateName(kind)
	default:
		s.leadStep = deallocInvalid
	}
}

// takeDeallocateName takes the current token as DEALLOCATE's operand: ALL,
// or a name (gram.y ColId: an identifier or a keyword that is neither
// reserved nor only a type or function name).
func (s *Scanner) takeDeallocateName(kind tokenKind) {
	s.leadStep = deallocInvalid
	switch kind {
	case tokWord:
		if s.wordIs("all") {
			s.deallocAll = true
			s.leadStep = deallocComplete
			return
		}
		if s.wordLen <= wordCap && isReservedForName(string(s.word[:s.wordLen])) {
			return
		}
	case tokQuotedIdent:
		if s.wordLen == 0 {
			return // "" is a zero-length delimited identifier: an error
		}
	default:
		return
	}
	s.deallocAll = false
	s.deallocLen = copy(s.deallocName[:], s.word[:truncatedLen(s.word[:], s.wordLen)])
	s.leadStep = deallocComplete
}

// truncatedLen is how many bytes of an identifier of length n (whose first
// wordCap bytes are in word) Postgres keeps: up to 63, cut back to the
// start of a UTF-8 character that byte 63 would split (pg_mbcliplen).
func truncatedLen(word []byte, n int) int {
	if n <= maxIdentifierLen {
		return n
	}
	cut := maxIdentifierLen
	for cut > 0 && word[cut]&0xc0 == 0x80 {
		cut--
	}
	return cut
}

// endStatement closes the current statement at a ';' or the end. A name
// being read ends with it (endNames, called first; kept apart, this stays
// small enough to inline).
func (s *Scanner) endStatement() {
	if s.tokens > 0 {
		s.statements++
	}
	if s.lead == leadDeallocate {
		s.deallocOK = s.leadStep == deallocComplete || s.leadStep == deallocAfterPrepare
	}
	s.statement = statement{
		statements:  s.statements,
		deallocName: s.deallocName,
		deallocLen:  s.deallocLen,
		deallocAll:  s.deallocAll,
		deallocOK:   s.deallocOK,
	}
}

// isReservedForName reports whether an unquoted word cannot be a name
// (ColId): the reserved keywords and the type_func_name keywords of
// src/include/parser/kwlist.h.
func isReservedForName(word string) bool {
	switch word {
	case "all", "analyse", "analyze", "and", "any", "array", "as", "asc",
		"asymmetric", "both", "case", "cast", "check", "collate", "column",
		"constraint", "create", "current_catalog", "current_date",
		"current_role", "current_time", "current_timestamp", "current_user",
		"default", "deferrable", "desc", "distinct", "do", "else", "end",
		"except", "false", "fetch", "for", "foreign", "from", "grant", "group",
		"having", "in", "initially", "intersect", "into", "lateral", "leading",
		"limit", "localtime", "localtimestamp", "not", "null", "offset", "on",
		"only", "or", "order", "placing", "primary", "references", "returning",
		"select", "session_user", "some", "symmetric", "system_user", "table",
		"then", "to", "trailing", "true", "union", "unique", "user", "using",
		"variadic", "when", "where", "window", "with",
		// type_func_name_keyword
		"authorization", "binary", "collation", "concurrently", "cross",
		"current_schema", "freeze", "full", "ilike", "inner", "is", "isnull",
		"join", "left", "like", "natural", "notnull", "outer", "overlaps",
		"right", "similar", "tablesample", "verbose":
		return true
	}
	return false
}
