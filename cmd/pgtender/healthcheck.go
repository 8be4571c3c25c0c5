package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// healthcheckTimeout bounds `pgtender --healthcheck URL`; the container
// runtime's own HEALTHCHECK --timeout may be shorter and kills it first.
const healthcheckTimeout = 5 * time.Second

// healthcheck is `pgtender --healthcheck URL`: it GETs URL (pgtender's
// /healthz or /readyz) and reports 0 on a 2xx answer, 1 on anything else.
// It exists for the container image's HEALTHCHECK: the image has no shell
// and no curl (https://docs.docker.com/reference/dockerfile/#healthcheck
// runs the exec form as it is). No proxy from the environment applies: the
// check is of this container's own port.
func healthcheck(url string, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), healthcheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintln(stderr, "pgtender --healthcheck:", err)
		return 1
	}
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		fmt.Fprintln(stderr, "pgtender --healthcheck:", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	answer := strings.TrimSpace(string(body))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		fmt.Fprintf(stderr, "pgtender --healthcheck: %s: %s %s\n", url, resp.Status, answer)
		return 1
	}
	fmt.Fprintf(stdout, "%s: %s %s\n", url, resp.Status, answer)
	return 0
}
