package netguard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"

	"github.com/outboxkit/orders/internal/netguard"
)

func ExampleGuard_CheckAddr() {
	var g netguard.Guard
	fmt.Println(g.CheckAddr(netip.MustParseAddr("1.1.1.1")))
	fmt.Println(g.CheckAddr(netip.MustParseAddr("::ffff:127.0.0.1")))
	fmt.Println(netguard.Guard{AllowPrivate: true}.CheckAddr(netip.MustParseAddr("192.168.1.10")))
	// Output:
	// <nil>
	// netguard: forbidden address: ::ffff:127.0.0.1 is loopback, which webhooks may not reach
	// <nil>
}

func ExampleGuard_CheckURL() {
	var g netguard.Guard
	ctx := context.Background()
	for _, u := range []string{
		"https://1.1.1.1/hooks",
		"ftp://1.1.1.1/hooks",
		"https://admin:hunter2@1.1.1.1/hooks",
		"http://169.254.169.254/latest/meta-data/",
	} {
		fmt.Println(g.CheckURL(ctx, u))
	}
	// Output:
	// <nil>
	// checking webhook url: netguard: invalid webhook url: scheme "ftp" is not http or https
	// checking webhook url: netguard: invalid webhook url: userinfo is not allowed
	// checking webhook url host: netguard: forbidden address: 169.254.169.254 is the cloud metadata service, which webhooks may not reach
}

func ExampleGuard_Client() {
	// httptest servers listen on loopback, which production refuses.
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()

	_, err := netguard.Guard{}.Client().Get(srv.URL)
	fmt.Println(errors.Is(err, netguard.ErrForbiddenAddress))

	resp, err := netguard.Guard{AllowPrivate: true}.Client().Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	fmt.Println(resp.StatusCode)
	// Output:
	// true
	// 200
}
