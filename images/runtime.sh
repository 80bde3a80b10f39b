#!/bin/sh
# Assemble /.quinebox: the guest's runtime, which quinebox mounts read-only
# into every box, whatever its image holds (another libc, no Python, no shell).
#
#   /.quinebox/lib/ld.so        this Python's own dynamic loader
#   /.quinebox/lib/python3      the interpreter, started only through ld.so
#   /.quinebox/lib/*.so*        the libraries it and its extension modules need
#   /.quinebox/lib/pythonX.Y/   the standard library, compiled
#   /.quinebox/guest/           quinebox's guest code, compiled
#   /.quinebox/bin/quinebox     `quinebox` inside a box (the guest's relay to the host)
#   /.quinebox/bin/init         the native init of a one-shot box (images/init.c), when the build was given one
#
# Run at image build time in the agent image: it needs the image's python3 and ldd.
set -eu
R=/.quinebox
GUEST=${1:?usage: runtime.sh GUEST_DIR [NATIVE_INIT]}
NATIVE_INIT=${2:-}
python=$(readlink -f /usr/bin/python3)
version=$(python3 -I -S -c 'import sys; print("%d.%d" % sys.version_info[:2])')
rm -rf "$R"
mkdir -p "$R/bin" "$R/lib" "$R/guest"

libs_of() { ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'; }

cp "$python" "$R/lib/python3"
cp -L "$(ldd "$python" | awk '$1 ~ /^\/.*ld-linux/ { print $1 }')" "$R/lib/ld.so"
for lib in $(libs_of "$python"); do cp -L "$lib" "$R/lib/"; done

# The standard library without what no guest needs (tests, GUIs, installers).
cp -a "/usr/lib/python$version" "$R/lib/python$version"
for unused in test idlelib tkinter turtledemo lib2to3 ensurepip distutils venv pydoc_data site-packages dist-packages; do
    rm -rf "$R/lib/python$version/$unused"
done
rm -rf "$R/lib/python$version"/config-*
# Links that leave the runtime (Debian points sitecustomize.py into /etc) would point into the image.
find "$R" -type l -lname "/*" -exec rm -f {} +
# Extension modules that need a library the runtime does not carry are left out.
for module in "$R/lib/python$version"/lib-dynload/*.so; do
    for lib in $(libs_of "$module"); do
        [ -e "$R/lib/$(basename "$lib")" ] || { rm -f "$module"; break; }
    done
done

cp "$GUEST"/*.py "$R/guest/"
cat > "$R/bin/quinebox" <<'EOF'
#!/bin/sh
exec /.quinebox/lib/ld.so --library-path /.quinebox/lib /.quinebox/lib/python3 -I -S /.quinebox/guest/cli.py "$@"
EOF
chmod 755 "$R/bin/quinebox"
if [ -n "$NATIVE_INIT" ] && [ -f "$NATIVE_INIT" ]; then
    cp "$NATIVE_INIT" "$R/bin/init"
    chmod 755 "$R/bin/init"
fi
# The root filesystem is read-only in a box: compile everything now.
"$R/lib/ld.so" --library-path "$R/lib" "$R/lib/python3" -I -S -m compileall -q -j 0 "$R/lib/python$version" "$R/guest" >/dev/null
chmod -R a+rX "$R"
