package netguard_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
)

// fakeResolver returns a resolver that answers A and AAAA queries from
// records, entirely in memory, so tests exercise the real DNS code path
// (including /etc/hosts for "localhost") without touching the network.
// Names not in records get NXDOMAIN.
func fakeResolver(t *testing.T, records map[string][]netip.Addr) *net.Resolver {
	t.Helper()
	return &net.Resolver{
		PreferGo: true,
		Dial: func(context.Context, string, string) (net.Conn, error) {
			client, server := net.Pipe()
			go serveDNS(server, records)
			return client, nil
		},
	}
}

// serveDNS answers one DNS-over-stream query (two-byte length prefix, as
// the Go resolver uses for connections that are not net.PacketConns).
func serveDNS(conn net.Conn, records map[string][]netip.Addr) {
	defer conn.Close()

	var size [2]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		return
	}
	query := make([]byte, binary.BigEndian.Uint16(size[:]))
	if _, err := io.ReadFull(conn, query); err != nil || len(query) < 12 {
		return
	}

	// Walk the question name to find where the question section ends.
	var labels []string
	off := 12
	for off < len(query) && query[off] != 0 {
		n := int(query[off])
		if off+1+n > len(query) {
			return
		}
		labels = append(labels, string(query[off+1:off+1+n]))
		off += 1 + n
	}
	off++ // terminating zero label
	if off+4 > len(query) {
		return
	}
	qtype := binary.BigEndian.Uint16(query[off:])
	question := query[12 : off+4]
	name := strings.ToLower(strings.Join(labels, "."))

	addrs, known := records[name]
	var answers [][]byte
	for _, addr := range addrs {
		switch {
		case qtype == 1 && addr.Is4():
			a := addr.As4()
			answers = append(answers, a[:])
		case qtype == 28 && addr.Is6():
			a := addr.As16()
			answers = append(answers, a[:])
		}
	}

	rcode := uint16(0)
	if !known {
		rcode = 3 // NXDOMAIN
	}
	msg := binary.BigEndian.AppendUint16(nil, binary.BigEndian.Uint16(query[0:2])) // ID
	msg = binary.BigEndian.AppendUint16(msg, 0x8180|rcode)                         // QR, RD, RA
	msg = binary.BigEndian.AppendUint16(msg, 1)                                    // QDCOUNT
	msg = binary.BigEndian.AppendUint16(msg, uint16(len(answers)))                 // ANCOUNT
	msg = binary.BigEndian.AppendUint16(msg, 0)                                    // NSCOUNT
	msg = binary.BigEndian.AppendUint16(msg, 0)                                    // ARCOUNT
	msg = append(msg, question...)
	for _, rdata := range answers {
		msg = binary.BigEndian.AppendUint16(msg, 0xc00c) // pointer to the question name
		msg = binary.BigEndian.AppendUint16(msg, qtype)
		msg = binary.BigEndian.AppendUint16(msg, 1)  // class IN
		msg = binary.BigEndian.AppendUint32(msg, 60) // TTL
		msg = binary.BigEndian.AppendUint16(msg, uint16(len(rdata)))
		msg = append(msg, rdata...)
	}

	out := binary.BigEndian.AppendUint16(nil, uint16(len(msg)))
	_, _ = conn.Write(append(out, msg...))
}
