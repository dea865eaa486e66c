import glob, re, sys, statistics, collections
B = sys.argv[1]
# per file: op -> (comp0, wait0, comp1, wait1) ms totals over 300 forwards
def parse(f):
    d = {}; med = None
    for line in open(f):
        if 'median' in line: med = float(re.search(r'median ([\d.]+)', line).group(1))
        m = re.match(r'(\S+)\s+\|\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+\|\s+(\d+)\s+([\d.]+)\s+([\d.]+)', line)
        if m: d[m.group(1)] = tuple(float(m.group(i)) / 300 for i in (3, 4, 6, 7))
        m = re.match(r'bimm prep barrier thread (\d): n \d+ wait ([\d.]+) ms', line)
        if m: d[f'prep{m.group(1)}'] = float(m.group(2)) / 300
    return med, d
for model in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"):
    for n in (1, 8):
        print(f"== {model}, {n}-token forwards: ms per forward, thread 0 / thread 1 (the two rounds' mean)")
        rows = collections.defaultdict(dict)
        meds = {}
        for v in ("13", "14"):
            fs = sorted(glob.glob(f"{B}/{v}-{model}-n{n}-round*.txt"))
            parsed = [parse(f) for f in fs]
            meds[v] = [p[0] for p in parsed]
            for op in parsed[0][1]:
                vals = [p[1][op] for p in parsed if op in p[1]]
                rows[op][v] = tuple(statistics.mean(x) for x in zip(*vals)) if isinstance(vals[0], tuple) else statistics.mean(vals)
        print(f"   forward medians: thirteenth {meds['13']}, fourteenth {meds['14']}")
        print(f"   {'op':14s} {'13: comp':>16s} {'13: wait':>14s} {'14: comp':>16s} {'14: wait':>14s}")
        for op, r in rows.items():
            if op.startswith('prep'):
                print(f"   {op:14s} barrier wait inside the products: {r.get('13', 0):.3f} -> {r.get('14', 0):.3f}")
                continue
            a, b = r.get('13'), r.get('14')
            f = lambda t: f"{t[0]:6.3f} / {t[2]:6.3f}  {t[1]:5.3f} / {t[3]:5.3f}" if t else "-"
            print(f"   {op:14s} {f(a)}    {f(b)}")
