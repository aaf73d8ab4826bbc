// Package maproom gives back the memory of Go maps that shrank. A map keeps the room of the
// most entries it ever held, through deletes and clear alike: after a churn of thousands of
// cgroups an agent's maps would hold megabytes for ever (TestAgentForgetsRemovedCgroups). A
// Room remembers that most, so that a map grown far beyond what it holds now is made again.
package maproom

// Floor: a map is made again only when it once held this many entries more than twice what it
// holds now; smaller ones are not worth the copy.
const Floor = 1024

// Room is the most entries a map (or a pair of maps used in turn) held since it was last made.
// The zero Room is ready.
type Room struct{ most int }

// Saw notes that the map holds n entries: call it where the map is largest, before deletes.
func (r *Room) Saw(n int) { r.most = max(r.most, n) }

// Oversized notes n as Saw does and reports whether a map now holding n entries once held far
// more; the caller then makes it again and says so with Made.
func (r *Room) Oversized(n int) bool {
	r.Saw(n)
	return r.most > 2*n+Floor
}

// Made says the map was made again holding n entries.
func (r *Room) Made(n int) { r.most = n }

// Fit returns m, or a copy of m made at its size when m once held far more (Oversized).
func Fit[M ~map[K]V, K comparable, V any](r *Room, m M) M {
	if !r.Oversized(len(m)) {
		return m
	}
	out := make(M, len(m)) // not maps.Clone, which keeps the room
	for k, v := range m {
		out[k] = v
	}
	r.Made(len(m))
	return out
}

// Delete deletes keys from m and returns it, or its copy at its size when it shrank far (Fit).
func Delete[M ~map[K]V, K comparable, V any](r *Room, m M, keys []K) M {
	r.Saw(len(m))
	for _, k := range keys {
		delete(m, k)
	}
	return Fit(r, m)
}
