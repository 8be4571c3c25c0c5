package wire

import "github.com/jackc/pgx/v5/pgproto3"

// Severity of an ErrorResponse written by pgtender itself.
const (
	SeverityError = "ERROR"
	SeverityFatal = "FATAL"
)

// AppendErrorResponse appends an ErrorResponse with the given severity,
// SQLSTATE code and message to dst.
func AppendErrorResponse(dst []byte, severity, code, message string) []byte {
	msg := pgproto3.ErrorResponse{
		Severity:            severity,
		SeverityUnlocalized: severity,
		Code:                code,
		Message:             message,
	}
	out, err := msg.Encode(dst)
	if err != nil {
		// Encode fails only on a body over 1 GiB, which a message
		// composed by pgtender cannot reach.
		panic("BUG: encoding ErrorResponse: " + err.Error())
	}
	return out
}

// AppendReadyForQuery appends ReadyForQuery with the transaction status to dst.
func AppendReadyForQuery(dst []byte, txStatus byte) []byte {
	return append(dst, MsgReadyForQuery, 0, 0, 0, 5, txStatus)
}

// AppendParameterStatus appends a ParameterStatus message to dst.
func AppendParameterStatus(dst []byte, name, value string) []byte {
	start := len(dst)
	dst = append(dst, MsgParameterStatus, 0, 0, 0, 0)
	dst = append(dst, name...)
	dst = append(dst, 0)
	dst = append(dst, value...)
	dst = append(dst, 0)
	putUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// AppendBackendKeyData appends BackendKeyData with a 4-byte secret, the
// protocol 3.0 form.
func AppendBackendKeyData(dst []byte, processID, secret uint32) []byte {
	dst = append(dst, MsgBackendKeyData, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 0)
	putUint32(dst[len(dst)-8:], processID)
	putUint32(dst[len(dst)-4:], secret)
	return dst
}

// AppendAuthenticationOk appends AuthenticationOk to dst.
func AppendAuthenticationOk(dst []byte) []byte {
	return append(dst, MsgAuthentication, 0, 0, 0, 8, 0, 0, 0, 0)
}

// AppendNegotiateProtocolVersion appends NegotiateProtocolVersion telling
// the client the newest minor version pgtender supports and the protocol
// options ("_pq_." parameters) it did not recognise.
func AppendNegotiateProtocolVersion(dst []byte, newestMinor uint32, unrecognized []string) []byte {
	start := len(dst)
	dst = append(dst, MsgNegotiateProtocol, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	putUint32(dst[start+5:], newestMinor)
	putUint32(dst[start+9:], uint32(len(unrecognized)))
	for _, name := range unrecognized {
		dst = append(dst, name...)
		dst = append(dst, 0)
	}
	putUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// AppendQuery appends a simple-protocol Query message to dst.
func AppendQuery(dst []byte, sql string) []byte {
	start := len(dst)
	dst = append(dst, MsgQuery, 0, 0, 0, 0)
	dst = append(dst, sql...)
	dst = append(dst, 0)
	putUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// AppendCancelRequest appends a CancelRequest packet (protocol 3.0 form for
// a 4-byte secret, longer secrets as protocol 3.2 allows) to dst. The
// protocol bounds the secret to 256 bytes; Postgres sends no longer ones.
func AppendCancelRequest(dst []byte, processID uint32, secret []byte) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	putUint32(dst[start+4:], cancelRequestCode)
	putUint32(dst[start+8:], processID)
	dst = append(dst, secret...)
	putUint32(dst[start:], uint32(len(dst)-start))
	return dst
}

// The replies the pooler writes itself when it answers a client's extended
// protocol messages without the server: a Parse of a statement the server
// connection already has, a Close of one it keeps for the pool. Layouts are
// in the PostgreSQL documentation, "Message Formats".

// AppendParseComplete appends ParseComplete to dst.
func AppendParseComplete(dst []byte) []byte {
	return append(dst, MsgParseComplete, 0, 0, 0, 4)
}

// AppendBindComplete appends BindComplete to dst.
func AppendBindComplete(dst []byte) []byte {
	return append(dst, MsgBindComplete, 0, 0, 0, 4)
}

// AppendCloseComplete appends CloseComplete to dst.
func AppendCloseComplete(dst []byte) []byte {
	return append(dst, MsgCloseComplete, 0, 0, 0, 4)
}

// AppendNoData appends NoData to dst.
func AppendNoData(dst []byte) []byte {
	return append(dst, MsgNoData, 0, 0, 0, 4)
}

// AppendEmptyQueryResponse appends EmptyQueryResponse to dst.
func AppendEmptyQueryResponse(dst []byte) []byte {
	return append(dst, MsgEmptyQueryResponse, 0, 0, 0, 4)
}

// AppendCommandComplete appends CommandComplete with the command tag (such
// as "DEALLOCATE" or "SELECT 1") to dst.
func AppendCommandComplete(dst []byte, tag string) []byte {
	start := len(dst)
	dst = append(dst, MsgCommandComplete, 0, 0, 0, 0)
	dst = append(dst, tag...)
	dst = append(dst, 0)
	putUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// AppendMessage appends a message of type typ with the given body to dst:
// a message read whole (by a Reader) passed on unchanged.
func AppendMessage(dst []byte, typ byte, body []byte) []byte {
	dst = append(dst, typ, 0, 0, 0, 0)
	putUint32(dst[len(dst)-4:], uint32(len(body)+4))
	return append(dst, body...)
}
