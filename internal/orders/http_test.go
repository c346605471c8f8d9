package orders_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/events/eventstest"
	"github.com/outboxkit/orders/internal/httpjson"
	"github.com/outboxkit/orders/internal/orders"
)

// line returns a request line with the given JSON values spliced in as is.
func line(sku, quantity, price string) string {
	return fmt.Sprintf(`{"sku":%s,"quantity":%s,"unit_price_cents":%s}`, sku, quantity, price)
}

func TestPlaceRefusesBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	ok := line(`"A-1"`, "1", "100")
	withLine := func(l string) string { return `{"customer_id":"c-1","lines":[` + l + `]}` }
	withCustomer := func(c string) string { return `{"customer_id":` + c + `,"lines":[` + ok + `]}` }

	type tc struct {
		body     string
		headers  []string
		status   int
		mentions []string
	}
	cases := map[string]tc{
		// Syntax: 400.
		"malformed JSON":          {body: `{"customer_id":"c-1","lines":[`, status: 400},
		"trailing comma":          {body: `{"customer_id":"c-1",}`, status: 400},
		"trailing object":         {body: validBody + `{}`, status: 400},
		"trailing garbage":        {body: validBody + ` x`, status: 400},
		"two objects, newline":    {body: validBody + "\n" + validBody, status: 400},
		"empty body":              {body: ``, status: 400, mentions: []string{"empty"}},
		"whitespace body":         {body: " \n\t", status: 400},
		"raw NUL in customer_id":  {body: withCustomer("\"c\x00-1\""), status: 400},
		"invalid UTF-8 customer":  {body: withCustomer("\"c\xff-1\""), status: 400, mentions: []string{"UTF-8"}},
		"invalid UTF-8 elsewhere": {body: validBody + " \xc3", status: 400, mentions: []string{"UTF-8"}},
		"byte order mark":         {body: "\xef\xbb\xbf" + validBody, status: 400},

		// Shape and meaning: 422.
		"JSON array":                {body: `[` + validBody + `]`, status: 422},
		"JSON string":               {body: `"order"`, status: 422},
		"JSON null":                 {body: `null`, status: 422, mentions: []string{"customer_id"}},
		"unknown top-level field":   {body: `{"customer_id":"c-1","coupon":"FREE","lines":[` + ok + `]}`, status: 422, mentions: []string{"coupon"}},
		"unknown line field":        {body: withLine(`{"sku":"A-1","quantity":1,"unit_price_cents":1,"colour":"red"}`), status: 422, mentions: []string{"colour"}},
		"a name in another case":    {body: `{"Customer_ID":"c-1","lines":[` + ok + `]}`, status: 422, mentions: []string{"Customer_ID"}},
		"a name given twice":        {body: `{"customer_id":"c-1","lines":[],"lines":[` + ok + `]}`, status: 400, mentions: []string{"lines", "twice"}},
		"a lone surrogate":          {body: `{"customer_id":"\ud800","lines":[` + ok + `]}`, status: 400, mentions: []string{"surrogate"}},
		"missing customer_id":       {body: `{"lines":[` + ok + `]}`, status: 422, mentions: []string{"customer_id"}},
		"empty customer_id":         {body: withCustomer(`""`), status: 422, mentions: []string{"customer_id"}},
		"whitespace customer_id":    {body: withCustomer(`" \t\n "`), status: 422, mentions: []string{"customer_id"}},
		"numeric customer_id":       {body: withCustomer(`42`), status: 422, mentions: []string{"customer_id"}},
		"escaped NUL customer_id":   {body: withCustomer(`"c\u0000-1"`), status: 422, mentions: []string{"customer_id"}},
		"customer_id too long":      {body: withCustomer(`"` + strings.Repeat("c", 201) + `"`), status: 422, mentions: []string{"customer_id"}},
		"lines missing":             {body: `{"customer_id":"c-1"}`, status: 422, mentions: []string{"lines"}},
		"lines null":                {body: `{"customer_id":"c-1","lines":null}`, status: 422, mentions: []string{"lines"}},
		"lines empty":               {body: `{"customer_id":"c-1","lines":[]}`, status: 422, mentions: []string{"lines"}},
		"lines an object":           {body: `{"customer_id":"c-1","lines":{}}`, status: 422, mentions: []string{"lines"}},
		"line null":                 {body: withLine(`null`), status: 422, mentions: []string{"lines[0]"}},
		"quantity zero":             {body: withLine(line(`"A-1"`, "0", "100")), status: 422, mentions: []string{"lines[0].quantity"}},
		"quantity negative":         {body: withLine(line(`"A-1"`, "-2", "100")), status: 422, mentions: []string{"lines[0].quantity"}},
		"quantity fractional":       {body: withLine(line(`"A-1"`, "1.5", "100")), status: 422, mentions: []string{"quantity"}},
		"quantity exponent":         {body: withLine(line(`"A-1"`, "1e2", "100")), status: 422, mentions: []string{"quantity"}},
		"quantity a string":         {body: withLine(line(`"A-1"`, `"2"`, "100")), status: 422, mentions: []string{"quantity"}},
		"quantity beyond int64":     {body: withLine(line(`"A-1"`, "9223372036854775808", "100")), status: 422, mentions: []string{"quantity"}},
		"quantity above max":        {body: withLine(line(`"A-1"`, fmt.Sprint(orders.MaxQuantity+1), "100")), status: 422, mentions: []string{"lines[0].quantity"}},
		"quantity missing":          {body: withLine(`{"sku":"A-1","unit_price_cents":1}`), status: 422, mentions: []string{"lines[0].quantity"}},
		"price negative":            {body: withLine(line(`"A-1"`, "1", "-1")), status: 422, mentions: []string{"lines[0].unit_price_cents"}},
		"price a string":            {body: withLine(line(`"A-1"`, "1", `"100"`)), status: 422, mentions: []string{"unit_price_cents"}},
		"price above max":           {body: withLine(line(`"A-1"`, "1", fmt.Sprint(int64(orders.MaxUnitPriceCents)+1))), status: 422, mentions: []string{"lines[0].unit_price_cents"}},
		"sku empty":                 {body: withLine(line(`""`, "1", "100")), status: 422, mentions: []string{"lines[0].sku"}},
		"sku whitespace":            {body: withLine(line(`"  "`, "1", "100")), status: 422, mentions: []string{"lines[0].sku"}},
		"sku missing":               {body: withLine(`{"quantity":1,"unit_price_cents":1}`), status: 422, mentions: []string{"lines[0].sku"}},
		"sku too long":              {body: withLine(line(`"`+strings.Repeat("s", 201)+`"`, "1", "100")), status: 422, mentions: []string{"lines[0].sku"}},
		"bad line after good lines": {body: withLine(ok + "," + ok + "," + line(`"A-1"`, "0", "1")), status: 422, mentions: []string{"lines[2].quantity"}},
		"too many lines":            {body: body("c-1", orders.MaxLines+1, ok), status: 422, mentions: []string{"lines", fmt.Sprint(orders.MaxLines)}},
		"idempotency key too long":  {body: validBody, headers: []string{"Idempotency-Key", strings.Repeat("k", 256)}, status: 422, mentions: []string{"idempotency key"}},
		"idempotency key not UTF-8": {body: validBody, headers: []string{"Idempotency-Key", "k\xff"}, status: 422, mentions: []string{"idempotency key"}},
		"idempotency key empty":     {body: validBody, headers: []string{"Idempotency-Key", "  "}, status: 400, mentions: []string{"Idempotency-Key", "empty"}},
		"idempotency key twice":     {body: validBody, headers: []string{"Idempotency-Key", "k-1", "Idempotency-Key", "k-2"}, status: 400, mentions: []string{"Idempotency-Key", "once"}},

		// Transport: 413 and 415.
		"body over 1 MiB":     {body: withCustomer(`"` + strings.Repeat("c", httpjson.MaxBody) + `"`), status: 413, mentions: []string{fmt.Sprint(httpjson.MaxBody)}},
		"padding over 1 MiB":  {body: validBody + strings.Repeat(" ", httpjson.MaxBody), status: 413},
		"text/plain":          {body: validBody, headers: []string{"Content-Type", "text/plain"}, status: 415, mentions: []string{"text/plain"}},
		"multipart":           {body: validBody, headers: []string{"Content-Type", "multipart/form-data; boundary=x"}, status: 415},
		"garbled media type":  {body: validBody, headers: []string{"Content-Type", "application/json; ==="}, status: 415},
		"text/plain and junk": {body: `not json`, headers: []string{"Content-Type", "text/plain"}, status: 415},
	}
	// quantity × price across lines: either the limits allow an overflowing
	// total, which must be refused, or they do not (and the largest total is
	// accepted, see TestPlaceAcceptsRequestsAtTheLimits).
	if overflowLines <= orders.MaxLines {
		cases["total overflows int64"] = tc{body: body("c-1", overflowLines, maxLine("A")), status: 422, mentions: []string{"overflow"}}
	}

	// One database for the table, cases in turn (a database per case costs
	// about half a second): each case starts from an empty database, proves
	// it left it empty, and empties it again should it fail, so a failure
	// is reported by the case that caused it.
	f := setup(t)
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			t.Cleanup(func() {
				_, err := f.pool.Exec(context.Background(), `TRUNCATE orders, order_lines, outbox_messages, outbox_attempts, outbox_events`)
				require.NoError(t, err)
			})
			require.Equal(t, counts{}, f.counts(t))
			requireProblem(t, f.post(t, tc.body, tc.headers...), tc.status, tc.mentions...)
			require.Equal(t, counts{}, f.counts(t), "a refused request writes no order, no line and no outbox row")
		})
	}
}

func TestOverflowIsReachableWithinTheLimits(t *testing.T) {
	t.Parallel()
	// Documents which branch TestPlaceRefusesBadInputAndWritesNothing takes:
	// with today's limits, 93 maximal lines overflow an int64 total.
	require.LessOrEqual(t, overflowLines, orders.MaxLines)
	_, _, err := setup(t).svc.Place(context.Background(), orders.PlaceRequest{
		CustomerID: "c",
		Lines: slices.Repeat([]orders.Line{{SKU: "A", Quantity: orders.MaxQuantity,
			UnitPriceCents: orders.MaxUnitPriceCents}}, overflowLines),
	})
	var invalid *orders.ValidationError
	require.ErrorAs(t, err, &invalid)
	require.Equal(t, "lines", invalid.Field)
}

// FuzzPlaceOrderDecode posts arbitrary bodies to the real handler: whatever
// arrives, the answer is a created order or a client error in problem+json,
// never a 500, and a refused request writes nothing.
func FuzzPlaceOrderDecode(f *testing.F) {
	pool := dbtest.Pool(f)
	eventstest.CheckEvents(f, pool.Config().ConnString())
	_, err := pool.Exec(context.Background(),
		`INSERT INTO webhook_endpoints (url, secret, event_types)
		 VALUES ('http://127.0.0.1:9/x', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', $1)`, orders.Events)
	require.NoError(f, err)
	handler := orders.NewService(pool, slog.New(slog.DiscardHandler)).Handler()
	count := func(t *testing.T) (n [3]int) {
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM orders), (SELECT count(*) FROM order_lines),
			(SELECT count(*) FROM outbox_events) + (SELECT count(*) FROM outbox_messages)`).
			Scan(&n[0], &n[1], &n[2]))
		n[2] /= 2 // an event and its one message
		return n
	}

	for _, seed := range []string{
		validBody,
		`{}`, `[]`, `null`, ``, `"x"`, `0`,
		`{"customer_id":"c","lines":[{"sku":"a","quantity":1.5,"unit_price_cents":1}]}`,
		`{"customer_id":"c","lines":[{"sku":"a","quantity":-1,"unit_price_cents":-1}]}`,
		`{"customer_id":"c","lines":[{"sku":"a","quantity":1,"unit_price_cents":1e30}]}`,
		`{"customer_id":"c\u0000","lines":[{"sku":"\ud800","quantity":1,"unit_price_cents":1}]}`,
		"{\"customer_id\":\"c\xff\",\"lines\":[{\"sku\":\"a\",\"quantity\":1,\"unit_price_cents\":1}]}",
		`{"customer_id":"c","lines":[{"sku":"a","quantity":1,"unit_price_cents":1}],"x":1}`,
		validBody + `{}`,
		body("c", overflowLines, maxLine("A")),
		strings.Repeat("[", 10000),
	} {
		f.Add([]byte(seed))
	}

	f.Fuzz(func(t *testing.T, b []byte) {
		before := count(t)
		req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/orders", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)

		res := rec.Result()
		require.Contains(t, []int{201, 400, 413, 415, 422}, res.StatusCode, "body: %s", rec.Body)
		after := count(t)
		if res.StatusCode == http.StatusCreated {
			var o orders.Order
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &o))
			require.Equal(t, orders.StatusPlaced, o.Status)
			require.Equal(t, [3]int{before[0] + 1, before[1] + len(o.Lines), before[2] + 1}, after)
			return
		}
		require.Equal(t, "application/problem+json", res.Header.Get("Content-Type"))
		var p httpjson.Problem
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
		require.Equal(t, res.StatusCode, p.Status)
		require.NotEmpty(t, p.Detail)
		require.Equal(t, before, after, "a refused request writes nothing")
	})
}
