package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
)

// roundTrip sends an inline command on c and reads a reply of bulk strings: a bulk string
// (one element), an array of them, or a simple string (one element). An error reply is an
// error.
func roundTrip(c net.Conn, r *bufio.Reader, cmd string) ([]string, error) {
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return nil, err
	}
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	switch line[0] {
	case '+':
		return []string{line[1:]}, nil
	case '-':
		return nil, fmt.Errorf("%s: %s", cmd, line[1:])
	case '$':
		s, ok, err := readBulk(r, line)
		if err != nil || !ok {
			return nil, err
		}
		return []string{s}, nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]string, 0, n)
		for range n {
			l, err := readLine(r)
			if err != nil {
				return nil, err
			}
			s, _, err := readBulk(r, l)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s: unexpected reply %q", cmd, line)
}

func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if len(line) < 3 {
		return "", fmt.Errorf("short reply line %q", line)
	}
	return line[:len(line)-2], nil
}

// readBulk reads the body of a bulk string whose header is line ($-1 is a nil: ok false).
func readBulk(r *bufio.Reader, line string) (string, bool, error) {
	if line[0] != '$' {
		return "", false, fmt.Errorf("want a bulk string, got %q", line)
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil {
		return "", false, err
	}
	if n < 0 {
		return "", false, nil
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(r, buf); err != nil {
		return "", false, err
	}
	return string(buf[:n]), true, nil
}
