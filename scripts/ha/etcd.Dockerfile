# One etcd member from Debian's etcd-server package, for docker-compose.yml's `ha` profile.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends etcd-server \
 && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["/usr/bin/etcd", "--name", "etcd", "--data-dir", "/var/lib/etcd", \
  "--listen-client-urls", "http://0.0.0.0:2379", "--advertise-client-urls", "http://etcd:2379", \
  "--listen-peer-urls", "http://0.0.0.0:2380", "--initial-advertise-peer-urls", "http://etcd:2380", \
  "--initial-cluster", "etcd=http://etcd:2380", "--initial-cluster-state", "new"]
