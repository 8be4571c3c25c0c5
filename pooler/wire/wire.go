// Package wire holds the Postgres frontend/backend protocol pieces the
// pooler needs on its hot path: message type names, startup packet parsing
// (the options parameter's switches included), a streaming message scanner
// that frames without decoding, and encoders for the few messages pgtender
// writes itself.
//
// Everything here works on byte slices owned by the caller; nothing keeps a
// reference to a slice after returning unless its doc comment says so.
package wire

// Frontend (client to server) message types.
const (
	MsgBind         byte = 'B'
	MsgClose        byte = 'C'
	MsgCopyData     byte = 'd'
	MsgCopyDone     byte = 'c'
	MsgCopyFail     byte = 'f'
	MsgDescribe     byte = 'D'
	MsgExecute      byte = 'E'
	MsgFlush        byte = 'H'
	MsgFunctionCall byte = 'F'
	MsgParse        byte = 'P'
	MsgPassword     byte = 'p' // PasswordMessage, SASLInitialResponse, SASLResponse
	MsgQuery        byte = 'Q'
	MsgSync         byte = 'S'
	MsgTerminate    byte = 'X'
)

// Backend (server to client) message types.
const (
	MsgAuthentication     byte = 'R'
	MsgBackendKeyData     byte = 'K'
	MsgCommandComplete    byte = 'C'
	MsgCopyInResponse     byte = 'G'
	MsgCopyOutResponse    byte = 'H'
	MsgCopyBothResponse   byte = 'W'
	MsgDataRow            byte = 'D'
	MsgErrorResponse      byte = 'E'
	MsgNoticeResponse     byte = 'N'
	MsgNotification       byte = 'A'
	MsgParameterStatus    byte = 'S'
	MsgReadyForQuery      byte = 'Z'
	MsgNegotiateProtocol  byte = 'v'
	MsgEmptyQueryResponse byte = 'I'
)

// Transaction status of a ReadyForQuery message.
const (
	TxIdle    byte = 'I' // not in a transaction block
	TxInBlock byte = 'T' // in a transaction block
	TxFailed  byte = 'E' // in a failed transaction block
)

// HeaderLen is the length of a regular message header: one type byte and a
// four-byte big-endian length that counts itself but not the type byte.
const HeaderLen = 5

// MaxMessageLen bounds the length field pgtender accepts on any message,
// the same 1 GiB bound Postgres puts on a message; larger ones are a
// protocol violation. Bodies are streamed, so this is not an allocation.
const MaxMessageLen = 1 << 30

func putUint32(b []byte, v uint32) {
	b[0] = byte(v >> 24)
	b[1] = byte(v >> 16)
	b[2] = byte(v >> 8)
	b[3] = byte(v)
}

func getUint32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}
