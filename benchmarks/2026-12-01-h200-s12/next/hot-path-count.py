"""Instructions per thread after the row's barrier along the fused kernel's fast path.

Usage: python3 hot-path-count.py KERNEL.sass   (cuobjdump -sass of one specialisation)

Static count of the SASS from the second BAR.SYNC to the first unconditional EXIT, less
the slow blocks of the E2M1 encoder (entered by "@P BRA P, X"; each ends at the target
of the "BRA T" just before X). Straight-line code, so it approximates what each thread
issues per row; it counts the rstd warp's extra work once for every thread.
"""
import re,sys
lines=open(sys.argv[1]).read().splitlines()
ins=[]
for l in lines:
    m=re.match(r'\s+/\*([0-9a-f]{4})\*/\s+(.*?);',l)
    if m: ins.append((int(m.group(1),16),m.group(2).strip()))
bars=[a for a,t in ins if 'BAR.SYNC' in t]
start=bars[1]
end=[a for a,t in ins if 'EXIT' in t and a>start and not t.startswith('@')][0]
# slow blocks: "@P BRA P, X" jumps into slow block starting X; it ends at the target T of the "BRA T" right before X
skip=0
addr={a:t for a,t in ins}
for a,t in ins:
    m=re.match(r'@!?P\d BRA !?P\d, 0x([0-9a-f]+)',t)
    if m and start<a<end:
        x=int(m.group(1),16)
        prev=addr.get(x-16,'')
        m2=re.match(r'BRA 0x([0-9a-f]+)',prev)
        if m2: skip+=(int(m2.group(1),16)-x)//16
print((end-start)//16, 'minus slow', skip, '=', (end-start)//16-skip)
