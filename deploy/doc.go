// Package deploy holds no code: it is the home of the deployment files
// (Dockerfile, Kubernetes, systemd, nginx and Caddy configurations) and of
// the tests that run them for real: nginx and Caddy in front of an
// upstream with slidegate serve as their check service, the container
// image built with podman, the Kubernetes manifests parsed, the Grafana
// dashboard's and the Prometheus alerts' queries run by a real Prometheus
// against live servers.
package deploy
