package db

import (
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// RegisterUUID registers uuid.UUID with m, for uuid and uuid[] (see
// ConfigurePool). pgx does not know the type: it sees a driver.Valuer, so
// for each uuid parameter it formatted the id as text, failed to encode that
// in binary, formatted the error, parsed the text back and encoded the
// result, and it read each uuid column through sql.Scanner from text. That
// was 12 % of the Go CPU of placing an order (a pprof of the write path's
// benchmark), and the relay's statements carry arrays of ids.
func RegisterUUID(m *pgtype.Map) {
	t := &pgtype.Type{Name: "uuid", OID: pgtype.UUIDOID, Codec: uuidCodec{}}
	m.RegisterType(t)
	m.RegisterType(&pgtype.Type{Name: "_uuid", OID: pgtype.UUIDArrayOID, Codec: &pgtype.ArrayCodec{ElementType: t}})
	// Where the server names no type (the simple protocol), the Go type
	// says which it is.
	m.RegisterDefaultPgType(uuid.UUID{}, "uuid")
	m.RegisterDefaultPgType([]uuid.UUID{}, "_uuid")
}

// uuidCodec is pgx's UUIDCodec, which also encodes uuid.UUID and scans
// into *uuid.UUID directly.
type uuidCodec struct{ pgtype.UUIDCodec }

func (c uuidCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(uuid.UUID); ok {
		if format == pgtype.BinaryFormatCode {
			return uuidEncodeBinary{}
		}
		return uuidEncodeText{}
	}
	return c.UUIDCodec.PlanEncode(m, oid, format, value)
}

func (c uuidCodec) PlanScan(m *pgtype.Map, oid uint32, format int16, target any) pgtype.ScanPlan {
	if _, ok := target.(*uuid.UUID); ok {
		if format == pgtype.BinaryFormatCode {
			return uuidScanBinary{}
		}
		return uuidScanText{}
	}
	return c.UUIDCodec.PlanScan(m, oid, format, target)
}

type uuidEncodeBinary struct{}

func (uuidEncodeBinary) Encode(value any, buf []byte) ([]byte, error) {
	id := value.(uuid.UUID)
	return append(buf, id[:]...), nil
}

type uuidEncodeText struct{}

func (uuidEncodeText) Encode(value any, buf []byte) ([]byte, error) {
	return append(buf, value.(uuid.UUID).String()...), nil
}

// A NULL scanned into a uuid.UUID leaves the zero id, as uuid.UUID's own
// Scan does: the behaviour the generated code had before.

type uuidScanBinary struct{}

func (uuidScanBinary) Scan(src []byte, target any) error {
	dst := target.(*uuid.UUID)
	if src == nil {
		*dst = uuid.Nil
		return nil
	}
	if len(src) != 16 {
		return fmt.Errorf("scanning uuid: %d bytes, want 16", len(src))
	}
	copy(dst[:], src)
	return nil
}

type uuidScanText struct{}

func (uuidScanText) Scan(src []byte, target any) error {
	dst := target.(*uuid.UUID)
	if src == nil {
		*dst = uuid.Nil
		return nil
	}
	id, err := uuid.ParseBytes(src)
	if err != nil {
		return fmt.Errorf("scanning uuid: %w", err)
	}
	*dst = id
	return nil
}
