// Package archtest holds no code: its test checks the modular monolith's
// import rules over the whole module (go list), so CI, and every copy of
// this template, keeps them. See docs/adding-a-module.md.
package archtest
