package doctor

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/meshbox/meshbox/appliance/modules"
)

// checkModules reads the module catalog and checks every manifest, every
// assignment of the cached bindings against it, and what the running node
// says of its modules.
func (d *Doctor) checkModules(ctx context.Context) Check {
	const name = "modules"
	dir := d.cfg.ModulesDir()
	cat := modules.LoadCatalog(dir)
	if cat.Err != nil {
		return fail(name, "the node's user must be able to read the catalog (modules.dir, MESHBOX_MODULES_DIR)", "%v", cat.Err)
	}
	var problems []string
	assigned := map[string]bool{}
	if d.snap != nil {
		for _, a := range d.snap.Bindings.Assignments {
			assigned[a.Module] = true
			e, ok := cat.Entries[a.Module]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("module %s is assigned but not in the catalog", a.Module))
			case e.Err != nil:
				problems = append(problems, e.Err.Error())
			default:
				if _, ok := e.Manifest.Selections[a.Selection]; !ok {
					problems = append(problems, fmt.Sprintf("module %s is assigned at selection %q, which its manifest lacks (it has %s)",
						a.Module, a.Selection, strings.Join(e.Manifest.SelectionNames(), ", ")))
				}
			}
		}
	}
	var unassignedBad []string
	for _, n := range slices.Sorted(maps.Keys(cat.Entries)) {
		if e := cat.Entries[n]; e.Err != nil && !assigned[n] {
			unassignedBad = append(unassignedBad, e.Err.Error())
		}
	}
	if d.status != nil {
		for _, m := range d.status.Modules {
			switch m.State {
			case modules.StateCrashLooping, modules.StateFailed, modules.StateNotInCatalog:
				problems = append(problems, fmt.Sprintf("module %s is %s: %s", m.Module, m.State, m.Error))
			}
			problems = append(problems, m.Warnings...)
		}
	}
	problems = slices.Compact(problems)
	switch {
	case len(problems) > 0:
		return fail(name, "meshbox modules shows each module's state; fix the manifest or the assignment (meshbox mesh assignments)",
			"%s", strings.Join(problems, "; "))
	case len(unassignedBad) > 0:
		return warn(name, "a module that is not assigned does not run; its manifest is checked anyway",
			"%s", strings.Join(unassignedBad, "; "))
	}
	return ok(name, "catalog %s: %d modules, every manifest valid", dir, len(cat.Entries))
}
