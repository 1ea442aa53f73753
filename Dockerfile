# Joist's container image: one statically linked `joist` binary and the CA bundle on an empty base,
# run as the non-root user 65532 (the Helm chart's runAsUser), `joist run` by default.
#
#   docker build -t joist .                        # builds the binary in the Rust image (network)
#   scripts/image                                  # what CI does: the binary built on the host,
#                                                  # the `prebuilt` stage built with buildah
#
# Static linking uses glibc's static libc (target-feature=+crt-static): its DNS resolver is built
# in, so the image needs no shared libraries.

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN RUSTFLAGS="-C target-feature=+crt-static" \
      cargo build --release --locked --target x86_64-unknown-linux-gnu --bin joist \
 && mkdir -p /image/etc/ssl/certs \
 && strip -o /image/joist target/x86_64-unknown-linux-gnu/release/joist \
 && cp /etc/ssl/certs/ca-certificates.crt /image/etc/ssl/certs/

# The final image from a binary and CA bundle already in the build context's `image/` directory.
FROM scratch AS prebuilt
COPY image/ /
USER 65532:65532
ENTRYPOINT ["/joist"]
CMD ["run"]

# The final image from the build stage.
FROM scratch
COPY --from=build /image/ /
USER 65532:65532
ENTRYPOINT ["/joist"]
CMD ["run"]
