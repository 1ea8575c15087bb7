"""The built-in calibration texts (written for this project; an export never downloads one).

CALIBRATION_TEXT (about 450 tokens) is what awq calibrates on. An int8 KV cache's scales are
static, so a channel's range must be seen before it is met: its calibration reads
KV_CALIBRATION_TEXT after it (3,090 tokens in all with SmolLM2's tokenizer), more registers of what people run
through a model -- markup, data formats, logs, code in several languages, arithmetic, dialogue,
other scripts -- none of them taken from a benchmark's evaluation text.
"""

# Varied registers (news, code, chat, prose, instructions, SQL, other languages), unrelated to
# any benchmark prompt.
CALIBRATION_TEXT = """\
The committee met on Tuesday to review the budget for the coming year. Most of the discussion \
concerned the cost of repairing the old bridge, which engineers say will need new supports within \
five years. Several members argued that the town should apply for a regional grant before raising \
local taxes.
def merge_sorted(a, b):
    result = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            result.append(a[i]); i += 1
        else:
            result.append(b[j]); j += 1
    return result + a[i:] + b[j:]
User: How do I convert Celsius to Fahrenheit?
Assistant: Multiply the temperature in Celsius by 9/5 and add 32. For example, 20 degrees Celsius \
is 68 degrees Fahrenheit.
In the early morning light, the fishing boats left the harbour one by one, their engines echoing \
off the cliffs. The gulls followed them out past the lighthouse, where the sea turned from green \
to a deep, cold blue.
Water boils at 100 degrees Celsius at sea level, but at higher altitudes the boiling point is \
lower because the air pressure is lower. This is why cooking pasta in the mountains takes longer.
1. Preheat the oven to 180 °C.  2. Mix the flour, sugar and eggs.  3. Bake for 25 minutes, until \
golden.
SELECT name, COUNT(*) AS orders FROM customers JOIN orders ON customers.id = orders.customer_id \
GROUP BY name ORDER BY orders DESC LIMIT 10;
Les enfants jouaient dans le parc pendant que leurs parents parlaient du week-end. Der Zug nach \
Berlin fährt um acht Uhr ab.
The function returns None if the key is missing; otherwise it returns the stored value and \
updates the access time, so that the least recently used entry can be evicted when the cache is \
full.
"""

KV_CALIBRATION_TEXT = """\

## Release checklist

| step | owner | status | notes |
|---|---|---|---|
| freeze the branch | Priya | done | tagged v2.4.0-rc1 on 3 March |
| run the migration on staging | Tomás | in progress | 14 of 19 tables copied, ETA 40 min |
| update the changelog | — | open | see `CHANGES.md`, section "Unreleased" |

- [x] rotate the API keys (`KEY_ID=ak_7f3c…`, expires 2027-01-31)
- [ ] confirm the backup at s3://ops-backups/nightly/2026-03-02T04:00Z.tar.zst
- [ ] email release-notes@example.org with the summary

```json
{"order_id": 48213, "customer": {"name": "Ana Lima", "tier": "gold"}, "items": [
  {"sku": "TEA-019", "qty": 3, "price": 4.75}, {"sku": "MUG-002", "qty": 1, "price": 12.0}],
  "shipping": null, "paid": true, "tags": ["gift", "express"]}
```

server:
  port: 8443
  workers: 4          # one per core
  tls: {cert: /etc/app/cert.pem, key: /etc/app/key.pem}
  limits: [1024, 4096, 16384]

2026-03-04 09:12:55.301 INFO  [scheduler] admitted request r-91 (prompt 412 tokens, row 3)
2026-03-04 09:12:55.318 WARN  [pool] connection to 10.0.4.17:5432 slow (812 ms), retrying 1/3
2026-03-04 09:12:56.002 ERROR [worker-2] KeyError: 'user_id' in handle_event (events.py:88)

date,station,temp_c,rain_mm,wind_kmh
2026-01-01,Bergen,4.2,11.8,27
2026-01-02,Bergen,3.9,0.0,12
2026-01-03,Tromsø,-7.5,0.4,33

$ git log --oneline -3 && du -sh ./build && grep -rn "TODO(" src/ | wc -l
a41c9e2 fix off-by-one in the ring buffer
7d00b13 add retries to the uploader
e5f2a6c bump version
1.3G	./build
17

function debounce(fn, wait = 250) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn.apply(this, args), wait);
  };
}

fn parse_pair(s: &str) -> Option<(i64, i64)> {
    let (a, b) = s.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

#include <stdio.h>
int main(void) { for (int i = 0; i < 3; i++) printf("%d^2 = %d\\n", i, i * i); return 0; }

<div class="card" id="user-42"><h2>Settings</h2><button onclick="save()">Save</button></div>

class Inventory:
    \"\"\"Counts of items by name; negative counts are refused.\"\"\"

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> int:
        if n < 0:
            raise ValueError(f"cannot add {n} of {name!r}")
        self._counts[name] = self._counts.get(name, 0) + n
        return self._counts[name]

Q: A train leaves at 14:35 and arrives at 18:10. How long is the trip?
A: From 14:35 to 18:35 is 4 hours; 18:10 is 25 minutes earlier, so 3 hours 35 minutes.

Solve 3x² − 12x + 9 = 0: divide by 3 to get x² − 4x + 3 = 0, which factors as (x − 1)(x − 3) = 0, so \
x = 1 or x = 3. Check: 3·9 − 36 + 9 = 0. The integral of 2x from 0 to 5 is 25; e^(iπ) + 1 = 0; \
√2 ≈ 1.41421356; 7 × 8 = 56; 1/3 ≈ 0.333…; 2^10 = 1024; 0.1 + 0.2 = 0.30000000000000004.

Prices rose 3.4% year on year in February, down from 3.9% in January, the statistics office said \
on Friday. Food and energy were the largest contributors; excluding them, the core rate held at \
2.8%. Analysts had expected 3.5%. The central bank meets again on 19 March.

User: my laptop says "disk almost full" but I can't find big files?
Assistant: Start with `du -h --max-depth=1 ~ | sort -h`, which lists the largest folders in your \
home directory. Caches (~/.cache), old downloads and virtual machine images are common culprits. \
If the system folders are full instead, `journalctl --vacuum-size=200M` trims old logs.
User: thanks!! that freed 40 GB 😄
Assistant: Glad it helped. Consider a monthly reminder to clear the downloads folder.

She had not expected the letter. It lay on the kitchen table, the envelope soft from travel, her \
name written in a hand she had not seen for eleven years. Outside, the neighbour's dog barked \
twice and went quiet. She made tea first, because some things should not be read in a hurry.

El mercado abre a las siete y media; conviene llegar temprano si quieres pan recién hecho. \
Il museo è chiuso il lunedì, ma la biblioteca resta aperta fino alle venti. \
Je moet het formulier vóór vrijdag indienen. A reunião foi adiada para a próxima semana. \
Сегодня в Москве облачно, температура около нуля, вечером возможен снег. \
東京の桜は例年より一週間早く咲きました。週末には多くの人が公園を訪れる予定です。 \
北京今天天气晴朗，最高气温十八度，适合出门散步。 \
서울 지하철은 새벽 다섯 시 반부터 운행합니다. \
Η συνάντηση θα γίνει στην Αθήνα την Πέμπτη. \
الاجتماع القادم سيكون يوم الأحد في الساعة العاشرة صباحا. \
कल सुबह बारिश होने की संभावना है। \
Toplantı saat üçte başlayacak, lütfen geç kalmayın.

Step 1 — unplug the device and wait 30 seconds. Step 2 — hold the reset button (the small hole \
next to the USB-C port) for 10 s until the LED blinks amber. Step 3 — reconnect; setup takes up \
to 5 min. If the LED stays red, contact support at +44 20 7946 0958 or support@example.com and \
quote your serial number (e.g. SN-2024-AX-00731).

Abstract. We study the convergence of stochastic gradient descent with momentum under \
heavy-tailed noise. Assuming the gradient noise has a bounded p-th moment for some p in (1, 2], \
we show that clipped SGD reaches an ε-stationary point in O(ε^{-(3p-2)/(p-1)}) iterations, and \
that this rate is tight up to logarithmic factors. Experiments on language modelling (Table 2) \
confirm the predicted dependence on p.

aaaa aaaa aaaa bbbb bbbb … — — — !!! ??? ... ### *** ___ ((( ))) [[[ ]]] {{{ }}} <<< >>> |||
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 250 1000 65536 3.14159 -273.15 1e-9

To whom it may concern: I am writing to request a refund for order #A-77120, delivered damaged \
on 12 February. Photos are attached. I would prefer the amount credited to the original card. \
Kind regards, J. Okafor

SELECT d.name, AVG(e.salary)::numeric(10,2) AS avg_salary
FROM employees e JOIN departments d USING (department_id)
WHERE e.hired_at >= DATE '2020-01-01'
GROUP BY d.name HAVING COUNT(*) > 5 ORDER BY avg_salary DESC;

Poem: the kettle hums, the window fogs, / a cat considers the radiator, / and the morning, not yet \
decided, / leans on the door like a late guest.
"""

__all__ = ["CALIBRATION_TEXT", "KV_CALIBRATION_TEXT"]
