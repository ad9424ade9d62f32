package programs

import "github.com/nats-io/nats.go/micro"

// serviceVerbs are the discovery requests a NATS micro service answers.
var serviceVerbs = []micro.Verb{micro.PingVerb, micro.InfoVerb, micro.StatsVerb}

// ServiceSubjects are the subjects a NATS micro service named name
// subscribes to for its discovery requests, as the micro framework makes
// them: for each of PING, INFO and STATS, the request to every service
// ($SRV.PING), to the services of that name ($SRV.PING.<name>) and to one
// instance of it ($SRV.PING.<name>.<id>, the id random at each start).
// The answers go to the requester's inbox, as a host's answers to calls
// do; a program with these rights cannot publish on $SRV.
func ServiceSubjects(name string) []string {
	var out []string
	for _, v := range serviceVerbs {
		for _, args := range [][2]string{{"", ""}, {name, ""}, {name, "*"}} {
			// Only an unknown verb or an id without a name fails, and
			// neither is asked for here.
			subj, _ := micro.ControlSubject(v, args[0], args[1])
			out = append(out, subj)
		}
	}
	return out
}
