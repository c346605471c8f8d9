package webhook

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// Body writes the webhook body, {"id","type","created_at","data"}: the
// event id, its type and time, and its data as it was stored. It is written
// by hand: the payload is JSON the database already validated, and
// json.Marshal would parse and compact it again for every message. The type
// is quoted as encoding/json would (a string always encodes).
func Body(id uuid.UUID, typ string, createdAt time.Time, data json.RawMessage) []byte {
	quotedType, _ := json.Marshal(typ)
	b := make([]byte, 0, 96+len(typ)+len(data))
	b = append(b, `{"id":"`...)
	b = append(b, id.String()...)
	b = append(b, `","type":`...)
	b = append(b, quotedType...)
	b = append(b, `,"created_at":"`...)
	b = createdAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","data":`...)
	b = append(b, data...)
	b = append(b, '}')
	return b
}
