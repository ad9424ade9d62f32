// Package suggest finds the known name nearest to a misspelt one, for the
// "did you mean …?" of an unknown command, environment variable, config
// key or capability. It imports only the standard library.
package suggest

// Nearest returns the name of known nearest to name, and whether one is
// near enough to suggest: at most one edit for a short name, about one
// edit in four letters for a longer one. Of names equally near, the first
// in known wins. name itself, when it is known, is not suggested.
func Nearest(name string, known []string) (string, bool) {
	best, bestD := "", -1
	for _, k := range known {
		if k == name {
			continue
		}
		if d := Distance(k, name); bestD < 0 || d < bestD {
			best, bestD = k, d
		}
	}
	if bestD < 0 || bestD > Near(name) {
		return "", false
	}
	return best, true
}

// Near is the most edits by which a name of that length may miss a known
// one and still be taken for it.
func Near(name string) int { return max(1, len(name)/4) }

// Distance is the edit distance of a and b, a swap of two neighbouring
// letters counting as one edit (optimal string alignment).
func Distance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
