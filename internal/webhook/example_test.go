package webhook_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/outboxkit/orders/internal/webhook"
)

func ExampleSign() {
	key, err := webhook.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		panic(err)
	}
	fmt.Println(webhook.Sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`)))
	// Output: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
}

func ExampleNewSecret() {
	secret, err := webhook.NewSecret()
	if err != nil {
		panic(err)
	}
	fmt.Println(strings.HasPrefix(secret, webhook.SecretPrefix))
	// Output: true
}

func ExampleSigner_SetHeaders() {
	signer, err := webhook.NewSigner("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		panic(err)
	}
	body := []byte(`{"test": 2432232314}`)
	req, err := http.NewRequest(http.MethodPost, "https://receiver.example/hooks", bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	signer.SetHeaders(req.Header, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), body)

	for _, name := range []string{"Content-Type", webhook.HeaderID, webhook.HeaderTimestamp, webhook.HeaderSignature} {
		fmt.Printf("%s: %s\n", name, req.Header.Get(name))
	}
	// Output:
	// Content-Type: application/json
	// webhook-id: msg_p5jXN8AQM9LWM0D4loKWxJek
	// webhook-timestamp: 1614265330
	// webhook-signature: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
}

func ExampleVerifier_Verify() {
	// During rotation the receiver accepts both the old and the new secret.
	verifier, err := webhook.NewVerifier(
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
		"whsec_c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24=",
	)
	if err != nil {
		panic(err)
	}
	// Pin the clock so the reference vector stays inside the tolerance window.
	verifier.Now = func() time.Time { return time.Unix(1614265330, 0) }

	h := http.Header{}
	h.Set(webhook.HeaderID, "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set(webhook.HeaderTimestamp, "1614265330")
	h.Set(webhook.HeaderSignature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")

	fmt.Println(verifier.Verify(h, []byte(`{"test": 2432232314}`)))

	err = verifier.Verify(h, []byte(`{"test": 0}`))
	fmt.Println(errors.Is(err, webhook.ErrNoMatchingSignature))
	// Output:
	// <nil>
	// true
}
