package loader

import "testing"

// FailPinRenames makes the renames that move pinned maps into place go
// through rename until the test ends.
func FailPinRenames(t testing.TB, rename func(from, to string) error) {
	t.Helper()
	saved := renamePin
	renamePin = rename
	t.Cleanup(func() { renamePin = saved })
}
