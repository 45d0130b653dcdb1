#[distlock::locked(locks = locks, name = "report", busy = "fail", wait = "5s")]
async fn report(locks: &distlock::Locks) -> distlock::Result<()> {
    Ok(())
}

fn main() {}
