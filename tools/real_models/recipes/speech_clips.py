"""Speech for the whisper products (and the speech tests): espeak-ng's synthetic English, made 16 kHz mono 16-bit
PCM by sox, in any venv (the standard library only).

The product (``speech-clips``)::

    clips.json       {"sample_rate": 16000, "clips": [{"name", "file", "text", "seconds", "voice", "speed",
                       "kind": "utterance" | "passage"}]}
    <name>.wav       one per clip: RIFF WAVE, 16000 Hz, 1 channel, 16-bit signed PCM
    reference.json   {"espeak-ng": its --version line, "sox": its --version line, "clips": the same list,
                      "checked": what was checked}

Six utterances of 3-10 s (different sentences, voices and speeds; numbers, a question) and one passage of 45-60 s
(timestamps, long audio: past one 30-s window). ``text`` is what espeak-ng was told to say, not a transcript: the
references of the whisper products say what the model heard. espeak-ng's and sox's output change with their
versions, so the builder keys this product on their ``--version`` output (``Product.tools``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

from common import arguments, check

SAMPLE_RATE = 16000
# name, espeak-ng voice, words per minute, text
UTTERANCES = [
    ("fox", "en-us", 160, "The quick brown fox jumps over the lazy dog."),
    ("question", "en-us", 150, "Can you tell me where the nearest train station is?"),
    ("meeting", "en-gb", 165, "The meeting starts at 9:30 on Tuesday, and 42 people have signed up for room 7."),
    ("shipping", "en-us+f3", 175, "In 2024 the company shipped 1500 devices to 12 countries across Europe and Asia."),
    ("battery", "en-gb", 140,
     "Neural processing units run speech recognition on laptops without draining the battery."),
    ("weather", "en-us+m3", 190, "Tomorrow will be cloudy in the morning, with a high of 18 degrees and light rain "
                                 "after four in the afternoon."),
]
PASSAGE = ("passage", "en-us", 165, (
    "Welcome to the weekly engineering update. This week the team finished the new audio pipeline, which now "
    "reads recordings from the meeting rooms and turns them into text. The first version was slow, so we moved "
    "the encoder to the neural processing unit, and a ten second clip now takes less than one second. "
    "Next, we looked at long recordings. A meeting of one hour is cut into windows of thirty seconds, and each "
    "window starts where the last sentence ended, so no words are lost between them. "
    "There are still three open problems. Numbers such as 1984 or 3.5 are sometimes written as words. Names of "
    "people are often spelled in different ways. And very quiet speakers are hard to hear. "
    "If you have recordings that show these problems, please send them to the team before Friday. Thank you, "
    "and see you next week."))
UTTERANCE_SECONDS = (3.0, 10.0)
PASSAGE_SECONDS = (45.0, 60.0)


def version(tool: str) -> str:
    return subprocess.run([tool, "--version"], capture_output=True, text=True, check=True).stdout.strip()


def synthesize(out: Path, name: str, voice: str, speed: int, text: str) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        raw = Path(scratch) / "espeak.wav"  # espeak-ng writes 22050 Hz mono
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(raw), text], check=True)
        subprocess.run(["sox", str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", "-e", "signed-integer",
                        str(out / f"{name}.wav")], check=True)
    with wave.open(str(out / f"{name}.wav")) as made:
        check((made.getframerate(), made.getnchannels(), made.getsampwidth()) == (SAMPLE_RATE, 1, 2),
              f"{name}.wav is 16 kHz mono 16-bit")
        return made.getnframes() / SAMPLE_RATE


out, _ = arguments()
for tool in ("espeak-ng", "sox"):
    check(shutil.which(tool) is not None, f"{tool} is installed")
clips = []
for kind, (name, voice, speed, text), (low, high) in (
        [("utterance", u, UTTERANCE_SECONDS) for u in UTTERANCES] + [("passage", PASSAGE, PASSAGE_SECONDS)]):
    seconds = synthesize(out, name, voice, speed, text)
    check(low <= seconds <= high, f"{name}: {seconds:.2f} s is within {low}-{high} s")
    clips.append({"name": name, "file": f"{name}.wav", "text": text, "seconds": round(seconds, 4), "voice": voice,
                  "speed": speed, "kind": kind})
(out / "clips.json").write_text(json.dumps({"sample_rate": SAMPLE_RATE, "clips": clips}, indent=1))
(out / "reference.json").write_text(json.dumps({
    "espeak-ng": version("espeak-ng"), "sox": version("sox"), "clips": clips,
    "checked": f"every file 16 kHz mono 16-bit; utterances {UTTERANCE_SECONDS} s, the passage {PASSAGE_SECONDS} s"},
    indent=1))
