// Command htpasswd writes the password file of the stack's registry that
// wants a login (test/stack/up.sh --start registry-auth): for each line
// "USER PASSWORD" on stdin, "USER:<bcrypt hash>" on stdout, the only form
// distribution's htpasswd access controller accepts
// (registry/auth/htpasswd/htpasswd.go). Built from this tools module because
// distribution already requires golang.org/x/crypto here: the same bcrypt
// hashes and verifies, and nothing outside the module proxy is needed.
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

func main() {
	sc := bufio.NewScanner(os.Stdin)
	n := 0
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		user, password, ok := strings.Cut(line, " ")
		if !ok || user == "" || password == "" || strings.ContainsAny(user, ":#") {
			fmt.Fprintf(os.Stderr, "htpasswd: line %q: want USER PASSWORD (no ':' or '#' in USER)\n", line)
			os.Exit(2)
		}
		// The lowest cost: the registry checks the hash on every request,
		// and these are throw-away passwords of a loopback test registry.
		h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
		if err != nil {
			fmt.Fprintf(os.Stderr, "htpasswd: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("%s:%s\n", user, h)
		n++
	}
	if err := sc.Err(); err != nil || n == 0 {
		fmt.Fprintf(os.Stderr, "htpasswd: no USER PASSWORD lines read (%v)\n", err)
		os.Exit(1)
	}
}
