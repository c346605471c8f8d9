package process

import (
	"path"
	"regexp"
	"runtime/debug"
	"strings"
)

// Name is the service's name, read from its module path when the program
// was built: the path's last element, a major version suffix aside, in
// lower case (orders, for github.com/outboxkit/orders). A service made
// from this template with ./task new:service has a module path of its own,
// and so names itself, not the template, wherever it introduces itself to
// another system. "service" when the build recorded no module path.
func Name() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "service"
	}
	return nameOf(bi.Main.Path)
}

// UserAgent is the User-Agent of the service's webhooks: its name and the
// version of the webhook format (orders-relay/1).
func UserAgent() string { return Name() + "-relay/1" }

// majorVersion is a module path's major version suffix (/v2).
var majorVersion = regexp.MustCompile(`/v[0-9]+$`)

// nameOf is Name for the module path mod: its last element, in lower
// case, each run of other characters than letters and digits a hyphen.
func nameOf(mod string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(path.Base(majorVersion.ReplaceAllString(mod, ""))) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	if name := strings.TrimSuffix(b.String(), "-"); name != "" {
		return name
	}
	return "service"
}
