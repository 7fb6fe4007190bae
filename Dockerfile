# rowsync in a container: `docker build -t rowsync .` then
#   docker run -p 2439:2439 -v rowsync-state:/var/lib/rowsync rowsync
# serves the SQLite database /var/lib/rowsync/consolidated.db with the packaged config
# (packaging/rowsync.toml). Give your own settings as ROWSYNC_* variables
# (ROWSYNC_DB=postgres://..., ROWSYNC_DB_PASSWORD_FILE=/run/secrets/db-password) or
# mount a config file over /etc/rowsync/rowsync.toml. README.md, "Running it".

# Build stage: the release binary, its debug information split off as scripts/release
# does (the slim image gets the binary alone).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin rowsync \
    && objcopy --only-keep-debug target/release/rowsync /rowsync.debug \
    && objcopy --strip-debug --add-gnu-debuglink=/rowsync.debug target/release/rowsync /rowsync

# Run stage: Debian slim, no compiler; TLS roots are compiled into the binary.
FROM debian:bookworm-slim
RUN useradd --system --home-dir /var/lib/rowsync --create-home --shell /usr/sbin/nologin rowsync
COPY --from=build /rowsync /usr/bin/rowsync
COPY packaging/rowsync.toml /etc/rowsync/rowsync.toml
# In a container the endpoints listen on every address of the container's own network;
# the admin endpoint (health, metrics) stays on loopback unless given a token
# (ROWSYNC_ADMIN_LISTEN=0.0.0.0:9464 with ROWSYNC_ADMIN_TOKEN_FILE).
ENV ROWSYNC_LISTEN=0.0.0.0:2439 \
    ROWSYNC_LOG_FORMAT=json \
    ROWSYNC_LOG=info
USER rowsync
WORKDIR /var/lib/rowsync
VOLUME ["/var/lib/rowsync"]
EXPOSE 2439
# docker stop sends SIGTERM: the server drains (drain_timeout_seconds, 30 s by
# default); give it `docker stop -t 45`.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/rowsync"]
CMD ["serve", "--config", "/etc/rowsync/rowsync.toml"]
