package httpjson

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf16"
)

// encoding/json matches a field's name ignoring case, lets the last of two
// equal names win, and turns an escaped lone surrogate (\ud800) into U+FFFD.
// Each makes the value stored differ from the one sent, or from the one a
// proxy that reads the same body sees: a body that relies on them is
// refused instead. strictNames and loneSurrogate run after a successful
// Decode, on the same bytes.

// strictNames walks body (one valid JSON value) beside the type it was
// decoded into and refuses a name that is not exactly one of a struct's
// JSON field names, and a name given twice in one object.
func strictNames(body []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	return walk(dec, t, "")
}

// walk reads one value from dec, whose Go type is t (nil when unknown: a
// map of interfaces, json.RawMessage, any), at path.
func walk(dec *json.Decoder, t reflect.Type, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t != nil && (t == rawMessage || t.Kind() == reflect.Interface) {
		t = nil // anything goes, but names are still not given twice
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return err
			}
			name := k.(string)
			at := strings.TrimPrefix(path+"."+name, ".")
			if seen[name] {
				return NewProblem(http.StatusBadRequest, "field %q is given twice", at)
			}
			seen[name] = true
			var elem reflect.Type
			if t != nil {
				switch t.Kind() {
				case reflect.Struct:
					f, ok := jsonField(t, name)
					if !ok {
						return NewProblem(http.StatusUnprocessableEntity, "unknown field %q", at)
					}
					elem = f
				case reflect.Map:
					elem = t.Elem()
				}
			}
			if err := walk(dec, elem, at); err != nil {
				return err
			}
		}
		_, err := dec.Token() // '}'
		return err
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walk(dec, elem, path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		_, err := dec.Token() // ']'
		return err
	}
	return nil
}

var rawMessage = reflect.TypeFor[json.RawMessage]()

// jsonField returns the type of t's field whose JSON name is exactly name,
// looking into embedded structs as encoding/json does.
func jsonField(t reflect.Type, name string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() && !f.Anonymous {
			continue
		}
		n, _, _ := strings.Cut(tag, ",")
		ft := f.Type
		if f.Anonymous && n == "" {
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				if typ, ok := jsonField(ft, name); ok {
					return typ, true
				}
				continue
			}
		}
		if n == "" {
			n = f.Name
		}
		if n == name {
			return f.Type, true
		}
	}
	return nil, false
}

// loneSurrogate refuses a string escape of half a UTF-16 surrogate pair:
// it stands for no character, and encoding/json would store U+FFFD.
func loneSurrogate(body []byte) error {
	inString := false
	for i := 0; i < len(body); i++ {
		switch c := body[i]; {
		case c == '"':
			inString = !inString
		case inString && c == '\\':
			i++
			if body[i] != 'u' {
				continue
			}
			r := hex4(body[i+1:])
			i += 4
			if !utf16.IsSurrogate(r) {
				continue
			}
			if r < 0xdc00 && i+6 < len(body) && body[i+1] == '\\' && body[i+2] == 'u' {
				if low := hex4(body[i+3:]); low >= 0xdc00 && low <= 0xdfff {
					i += 6
					continue
				}
			}
			return NewProblem(http.StatusBadRequest, "malformed JSON: %s is half a UTF-16 surrogate pair, not a character", body[i-5:i+1])
		}
	}
	return nil
}

// hex4 reads the four hex digits of a \u escape, which Decode has checked.
func hex4(b []byte) rune {
	n, _ := strconv.ParseUint(string(b[:4]), 16, 32)
	return rune(n)
}
